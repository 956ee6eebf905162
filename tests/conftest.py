"""Suite-wide setup: the bundled Redis when REDIS_URL is unset, a committed test database, and
the admin API's everyday personas (owner: staff; teammate: a viewer of the default project;
outsider: anonymous). The whole cast, project owners and tokens too, is tests.support.personas."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from nexus import embedded_redis
from nexus.env import bundled_redis_socket
from nexus.models import Project, Role, default_project_pk
from tests.nexus.factories import make_user
from tests.support.personas import add_member, signed_in

_bundled_redis: subprocess.Popen[bytes] | None = None
# The configured (non-test) database; a connection still naming it has no test database yet.
_CONFIGURED_DB_NAME = settings.DATABASES["default"]["NAME"]


def pytest_configure(config: pytest.Config) -> None:
    global _bundled_redis
    if settings.NEXUS_BUNDLED_REDIS:
        _bundled_redis = embedded_redis.ensure(bundled_redis_socket(settings.DATA_DIR))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _bundled_redis is not None:
        embedded_redis.stop(_bundled_redis)


@pytest.fixture(scope="session")
def committed_db(django_db_setup: None, django_db_blocker) -> Iterator[None]:
    """The test database for data that real server processes must see, so it is committed.

    pytest-django creates test databases only when some collected test asks for `db`; tests
    that talk to a live server through its processes do not, so create it here if needed.
    """
    from django.test.utils import setup_databases, teardown_databases

    created = None
    if connection.settings_dict["NAME"] == _CONFIGURED_DB_NAME:
        with django_db_blocker.unblock():
            created = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    if created is not None:
        with django_db_blocker.unblock():
            teardown_databases(created, verbosity=0)


@pytest.fixture
def owner(db: None) -> APIClient:
    client = APIClient()
    client.force_login(make_user("owner", staff=True))
    return client


@pytest.fixture
def teammate(db: None) -> APIClient:
    user = make_user("teammate")
    add_member(Project.objects.get(pk=default_project_pk()), user, Role.VIEWER)
    return signed_in(user)


@pytest.fixture
def outsider() -> APIClient:
    return APIClient()
