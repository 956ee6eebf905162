"""`flush` for the test suite: on PostgreSQL, delete the rows of the tables that hold any.

Django's TransactionTestCase empties the database with `flush` after every test that commits
(websockets, live servers). Django's truncates every table; truncating only those holding rows
still took 0.14 s a test on an idle 2-core machine and about a second while the disk was busy
(then `TRUNCATE ... CASCADE` 450 ms: the seeded tables, the default project, resource groups and
presets, always hold rows, and the cascade reached most tables; and post_migrate recreating
every content type and permission, one commit per app, 400 ms). This command finds the tables
holding rows in one query and deletes their rows in one transaction (every foreign key Django
creates on PostgreSQL is checked at commit, so the order does not matter), keeps content types
and permissions (a function of the installed models, which post_migrate would only create
again), then sends post_migrate as Django's does (unless inhibited): it recreates the seeded
rows. 0.045 s a test on the idle machine, 0.13 s with the disk busy.
Anything else (another database, `reset_sequences`, a person at a prompt) gets Django's own.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management.commands import flush
from django.core.management.sql import emit_post_migrate_signal
from django.db import connections, transaction

KEPT_TABLES = frozenset({ContentType._meta.db_table, Permission._meta.db_table})


class Command(flush.Command):
    def handle(self, **options: Any) -> None:
        connection = connections[options["database"]]
        if (
            connection.vendor != "postgresql"
            or options["interactive"]
            or options.get("reset_sequences", True)
        ):
            super().handle(**options)
            return
        tables = [
            table
            for table in connection.introspection.django_table_names(
                only_existing=True, include_views=False
            )
            if table not in KEPT_TABLES
        ]
        if not tables:
            return
        quote = connection.ops.quote_name
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(
                " UNION ALL ".join(
                    f"SELECT %s WHERE EXISTS (SELECT 1 FROM {quote(table)})" for table in tables
                ),
                tables,
            )
            for (table,) in cursor.fetchall():
                cursor.execute(f"DELETE FROM {quote(table)}")
        if not options.get("inhibit_post_migrate", False):
            emit_post_migrate_signal(options["verbosity"], False, options["database"])
