"""`flush` for the test suite: on PostgreSQL, truncate only the tables that hold rows.

Django's TransactionTestCase empties the database with `flush` after every test that commits
(websockets, live servers): on PostgreSQL that truncates every table, about fifty, 0.2-0.4 s a
test, though a test leaves rows in a handful. This command finds those in one query and truncates
them alone, then does what Django's does after (the post_migrate signal, unless inhibited).
Anything else (another database, `reset_sequences`, a person at a prompt) gets Django's own.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import flush
from django.core.management.sql import emit_post_migrate_signal
from django.db import connections


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
        tables = connection.introspection.django_table_names(
            only_existing=True, include_views=False
        )
        if not tables:
            return
        quote = connection.ops.quote_name
        with connection.cursor() as cursor:
            cursor.execute(
                " UNION ALL ".join(
                    f"SELECT %s WHERE EXISTS (SELECT 1 FROM {quote(table)})" for table in tables
                ),
                tables,
            )
            holding_rows = [table for (table,) in cursor.fetchall()]
        if holding_rows:
            connection.ops.execute_sql_flush(
                connection.ops.sql_flush(
                    self.style,
                    holding_rows,
                    reset_sequences=False,
                    # A table referencing one of these must go too, empty or not (PostgreSQL
                    # refuses otherwise): everything ends empty either way.
                    allow_cascade=True,
                )
            )
        if not options.get("inhibit_post_migrate", False):
            emit_post_migrate_signal(options["verbosity"], False, options["database"])
