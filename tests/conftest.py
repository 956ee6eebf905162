"""Suite-wide setup: the bundled Redis when REDIS_URL is unset, each test's tier and time limit,
a committed test database, and the admin API's everyday personas (owner: staff; teammate: a viewer
of the default project; outsider: anonymous). The whole cast, project owners and tokens too, is
tests.support.personas."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from pytest_django.fixtures import Settings
from pytest_django.plugin import blocking_manager_key
from rest_framework.test import APIClient

from nexus import embedded_redis
from nexus.env import bundled_redis_socket
from nexus.models import Project, Role, default_project_pk
from tests.nexus.factories import make_user
from tests.support import durations
from tests.support.personas import add_member, signed_in
from tests.support.tiers import TIERS, Classifier, UnitGuard, strongest, tier_from_path

_bundled_redis: subprocess.Popen[bytes] | None = None
# The configured (non-test) database; a connection still naming it has no test database yet.
_CONFIGURED_DB_NAME = settings.DATABASES["default"]["NAME"]
TESTS_ROOT = Path(__file__).parent
# Seconds a test may take, by tier (pyproject's `timeout` is the unit tests'): generous, since
# they run beside each other on two cores; a test that needs more says so with its own marker.
TIMEOUT_S = {"live": 180, "e2e": 180, "system": 900}
_unit_guard: UnitGuard | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="write each module's seconds into tests/durations.json (`make test-durations`)",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _bundled_redis, _unit_guard
    if config.getoption("record_durations"):
        config.pluginmanager.register(durations.Recorder(durations.DURATIONS_PATH))
    # xdist's controller runs no test: each worker starts its own bundled Redis.
    runs_tests = hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", 0)
    if settings.NEXUS_BUNDLED_REDIS and runs_tests:
        _bundled_redis = embedded_redis.ensure(bundled_redis_socket(settings.DATA_DIR))
    _unit_guard = UnitGuard(_shared_services())


def _shared_services() -> list[tuple[str, int]]:
    """Return the TCP addresses a unit test may still connect to: the database and Redis."""
    addresses = []
    database = settings.DATABASES["default"]
    if database.get("HOST"):
        addresses.append((database["HOST"], int(database.get("PORT") or 5432)))
    redis = urlsplit(settings.REDIS_URL)
    if redis.scheme in ("redis", "rediss"):
        addresses.append((redis.hostname or "127.0.0.1", redis.port or 6379))
    return addresses


# First: pytest-xdist's own hook (registered after this conftest, so otherwise called before it)
# reads the `xdist_group` markers given here into the node ids it schedules by.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test its tier (unless it names one) and its tier's time limit; order the
    modules longest first (tests/support/durations.py)."""
    classifier = Classifier()
    untiered = []
    for item in items:
        named = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if len(named) > 1:
            untiered.append(f"{item.nodeid}: several tiers {named}")
            continue
        if named:
            tier = named[0]
        else:
            tier = tier_from_path(item.path, TESTS_ROOT) or _derived_tier(classifier, item)
            item.add_marker(tier)
        if tier in TIMEOUT_S and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(TIMEOUT_S[tier]))
        if tier not in TIERS:
            untiered.append(f"{item.nodeid}: no tier")
    # `--dist loadgroup` keeps a module whose tests share a world on one xdist worker, all its
    # tests in one run: its servers start once, and its module-level teardown (a client closed,
    # the database emptied) comes after its last test, not before some of them.
    sharing = {item.path for item in items if _shares_a_world(item)}
    for item in items:
        if item.path in sharing:
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(TESTS_ROOT).as_posix()))
    if untiered:
        raise pytest.UsageError("Tests without exactly one tier:\n" + "\n".join(untiered))
    durations.longest_modules_first(items, durations.read())


def _derived_tier(classifier: Classifier, item: pytest.Item) -> str:
    """Return the tier of what the test function and every fixture it uses call."""
    functions = [getattr(item, "function", None)]
    fixture_info = getattr(item, "_fixtureinfo", None)
    if fixture_info is not None:
        for definitions in fixture_info.name2fixturedefs.values():
            functions += [definition.func for definition in definitions]
    return strongest(*(classifier.tier_of(f) for f in functions if f is not None))


def _shares_a_world(item: pytest.Item) -> bool:
    """Return whether the test uses a fixture of the suite's that outlives one test."""
    fixture_info = getattr(item, "_fixtureinfo", None)
    if fixture_info is None:
        return False
    return any(
        definition.scope in ("module", "class", "package")
        and definition.func.__module__.startswith("tests.")
        for definitions in fixture_info.name2fixturedefs.values()
        for definition in definitions
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    assert _unit_guard is not None
    # Set on xdist's workers under `--dist loadgroup`: a grouped test must carry its group in its
    # node id, or the scheduler splits its module, whose servers then start on every worker.
    if (
        getattr(item.config.option, "loadgroup", False)
        and item.get_closest_marker("xdist_group")
        and "@" not in item.nodeid
    ):
        pytest.fail(
            "pytest-xdist did not put this test's group in its node id: its module's servers "
            "would start on every worker (see the pytest pin in pyproject.toml).",
            pytrace=False,
        )
    _unit_guard.seen.clear()
    _unit_guard.active = item.get_closest_marker("unit") is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Fail a unit test that started a process or opened a connection: it belongs to `live`."""
    report = yield
    assert _unit_guard is not None
    if report.when == "call" and _unit_guard.active:
        _unit_guard.active = False
        if _unit_guard.seen and report.passed:
            report.outcome = "failed"
            report.longrepr = (
                "a unit test must start no process and open no connection but to the database "
                "and Redis; this one " + "; ".join(sorted(set(_unit_guard.seen))) + ". Mark "
                "it (or its module) `live`, or make its helper reach a name in "
                "tests/support/tiers.py's LIVE_NAMES."
            )
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a module's shared world is torn down, empty the test database as TransactionTestCase
    does: a world commits its rows, and one it forgets (a token, a login session) would be seen
    by the worker's later tests, which count rows, depending on which modules ran before."""
    result = yield
    last_of_module = nextitem is None or nextitem.path != item.path
    # Only ever the test database: a module whose tests never asked for one still names the
    # configured database here.
    if (
        last_of_module
        and item.get_closest_marker("xdist_group")
        and connection.settings_dict["NAME"] != _CONFIGURED_DB_NAME
    ):
        with item.config.stash[blocking_manager_key].unblock():
            call_command("flush", verbosity=0, interactive=False, reset_sequences=False)
    return result


def pytest_unconfigure(config: pytest.Config) -> None:
    if _bundled_redis is not None:
        embedded_redis.stop(_bundled_redis)


def end_other_sessions() -> None:
    """End the test database's other sessions, before it is dropped.

    Consumers run their queries in asgiref's threads, whose connections outlive the tests; on
    PostgreSQL, DROP DATABASE waits five seconds for them and then fails ("being accessed by
    other users"), at the end of every worker.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker) -> Iterator[None]:
    """pytest-django's test database, whose other sessions are ended before it is dropped."""
    yield
    with django_db_blocker.unblock():
        end_other_sessions()


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
        # Dropped here, before django_db_setup's teardown: its other sessions end here too (a
        # worker whose tests all used this database failed at its end, "being accessed by other
        # users").
        with django_db_blocker.unblock():
            end_other_sessions()
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


@pytest.fixture
def data_dir(settings: Settings, tmp_path: Path) -> Path:
    """The test's own data dir (tmp_path/data), which the processes it starts share: model
    folders land in data/models."""
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR
