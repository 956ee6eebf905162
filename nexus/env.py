"""Typed readers for the environment: every setting comes from here, with an embedded default."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    """Return the variable's value, or the default when unset."""
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    """Return the variable as a boolean; refuse words that are not clearly yes or no."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no).")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """Return the variable as an integer no smaller than minimum."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {minimum}.")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    """Return the variable as a number no smaller than minimum."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {minimum}.")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """Return the variable's value if it is one of choices."""
    value = os.environ.get(name, default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r}: choose one of {', '.join(choices)}.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Return a comma-separated variable as a list of non-empty items."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def data_dir() -> Path:
    """Return the data directory (created if missing, mode 0700): SQLite, secret key, bundled
    Redis. Its files hold session keys and token hashes, so nobody else may list or read them."""
    path = Path(os.environ.get("NEXUS_DATA_DIR", "var")).resolve()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    # An older install made it 0755: narrow it too.
    path.chmod(0o700)
    return path


def private_sqlite(path: Path) -> None:
    """Create the SQLite database file with mode 0600 before SQLite does, and narrow an older one.

    SQLite creates the WAL and shared-memory files with the database file's mode, so they
    follow; the umask alone would leave all three readable by everyone (0644).
    """
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for companion in ("", "-wal", "-shm", "-journal"):
        file = path.with_name(path.name + companion)
        if file.exists():
            file.chmod(0o600)


def persistent_secret(path: Path) -> str:
    """Return the secret stored at path, generating it (mode 0600) on first use."""
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        # Another process started at the same moment and wrote it first.
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    return value


def bundled_redis_socket(directory: Path) -> Path:
    """Return the Unix socket path of the bundled Redis server under the data dir."""
    return directory / "redis.sock"
