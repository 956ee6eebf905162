"""Suite-wide setup: the bundled Redis when REDIS_URL is unset."""

from __future__ import annotations

import subprocess

import pytest
from django.conf import settings

from nexus import embedded_redis
from nexus.env import bundled_redis_socket

_bundled_redis: subprocess.Popen[bytes] | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _bundled_redis
    if settings.NEXUS_BUNDLED_REDIS:
        _bundled_redis = embedded_redis.ensure(bundled_redis_socket(settings.DATA_DIR))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _bundled_redis is not None:
        embedded_redis.stop(_bundled_redis)
