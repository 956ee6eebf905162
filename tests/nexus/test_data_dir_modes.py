"""The data dir and what Nexus writes in it are private (dir 0700, files 0600), whatever umask."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.support.live import REPO_ROOT

# Runs in a fresh process, as `make run` would: the settings make the data dir and the database,
# migrate writes through SQLite's WAL, and the bundled Redis opens its socket there.
FIRST_RUN = """
import django, json, os
os.environ["DJANGO_SETTINGS_MODULE"] = "nexus.settings"
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from nexus import embedded_redis
from nexus.env import bundled_redis_socket
call_command("migrate", verbosity=0)
with connection.cursor() as cursor:
    cursor.execute("INSERT INTO nexus_project (name, description, created_at) "
                   "VALUES ('x', '', CURRENT_TIMESTAMP)")
redis = embedded_redis.start(bundled_redis_socket(settings.DATA_DIR))
try:
    modes = {}
    for path in sorted(settings.DATA_DIR.iterdir()):
        modes[path.name] = oct(os.stat(path).st_mode & 0o777)
    print(json.dumps(modes))
finally:
    embedded_redis.stop(redis)
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_first_run_leaves_nothing_readable_by_others(tmp_path: Path) -> None:
    # Given a fresh data dir and a permissive umask,
    data = tmp_path / "data"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "NEXUS_SECRET_KEY")
    } | {"NEXUS_DATA_DIR": str(data)}

    # when Nexus starts there, migrates and writes (the WAL is live while it runs),
    done = subprocess.run(
        [sys.executable, "-c", FIRST_RUN],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert done.returncode == 0, done.stderr
    modes = json.loads(done.stdout.strip().splitlines()[-1])

    # then the dir is 0700 and the database, its WAL, the secret key and the socket are private.
    assert mode(data) == 0o700
    assert {name: modes[name] for name in ("nexus.sqlite3", "nexus.sqlite3-wal", "secret_key")} == {
        "nexus.sqlite3": "0o600",
        "nexus.sqlite3-wal": "0o600",
        "secret_key": "0o600",
    }
    assert modes["redis.sock"] == "0o700"
    assert all(int(value, 8) & 0o077 == 0 for name, value in modes.items() if name != "redis.log")


def test_an_older_installs_files_are_narrowed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    database = data / "nexus.sqlite3"
    database.write_bytes(b"")
    database.chmod(0o644)
    env = dict(os.environ) | {"NEXUS_DATA_DIR": str(data)}
    env.pop("DATABASE_URL", None)

    done = subprocess.run(
        [sys.executable, "-c", "import nexus.settings"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert (mode(data), mode(database)) == (0o700, 0o600)
