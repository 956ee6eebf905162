"""What keeps pytest-xdist's workers apart: each worker gets its own data dir (its SQLite files
and its bundled Redis), its own Redis database and key prefix when REDIS_URL names a shared
server, and its own block of loopback ports (tests/support/ports.py)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

# The variable that says a process's environment was already made this worker's: the servers a
# test starts inherit it, and must not be moved a second time.
ISOLATED_FOR = "NEXUS_TEST_WORKER"


def worker_index(environ: MutableMapping[str, str] = os.environ) -> int | None:
    """Return this xdist worker's number (gw3: 3), or None outside xdist."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else None


def isolate_worker(environ: MutableMapping[str, str] = os.environ) -> None:
    """Point this worker's Nexus at its own data dir, Redis database and prefix (no-op outside
    xdist, or when done already)."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    index = worker_index(environ)
    if index is None or environ.get(ISOLATED_FOR) == worker:
        return
    environ[ISOLATED_FOR] = worker
    environ["NEXUS_DATA_DIR"] = os.path.join(environ.get("NEXUS_DATA_DIR", "var"), worker)
    environ["NEXUS_REDIS_PREFIX"] = f"{environ.get('NEXUS_REDIS_PREFIX', 'nexus')}-{worker}"
    if environ.get("REDIS_URL"):
        environ["REDIS_URL"] = redis_url_for_worker(environ["REDIS_URL"], index)


def redis_url_for_worker(url: str, index: int) -> str:
    """Return the URL of the database after the configured one by index + 1.

    Keys the prefix cannot reach (Celery's bindings, unacknowledged tasks) and any flush stay in
    the worker's own database; Redis has 16 unless configured otherwise, so up to 15 workers.
    """
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    # redis://host:port/N names its database in the path; unix:///socket?db=N in the query.
    in_path = parts.scheme in ("redis", "rediss")
    configured = int((parts.path.strip("/") if in_path else query.get("db", ["0"])[0]) or 0)
    database = configured + 1 + index
    if database > 15:
        raise RuntimeError(f"{url}: no Redis database left for xdist worker {index}")
    if in_path:
        return urlunsplit(parts._replace(path=f"/{database}"))
    query["db"] = [str(database)]
    # Written out: urlunsplit drops the empty host of unix:///path.
    return f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(query, doseq=True)}"
