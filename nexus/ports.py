"""The ports the controller's own processes listen on: replicas are never given one of them."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings

from nexus.env import env_list

DEFAULT_DEMO_PORTS = ["9101", "9102", "9103"]


def controller_ports() -> dict[int, str]:
    """Return each port the controller's processes use, with what uses it and which setting
    chose it: the web server, the local agent, the demo engines, and Redis when on TCP."""
    ports = {
        settings.NEXUS_PORT: "the web server (NEXUS_PORT)",
        settings.NEXUS_AGENT_PORT: "the local agent (NEXUS_AGENT_PORT)",
    }
    for raw in env_list("NEXUS_DEMO_PORTS", DEFAULT_DEMO_PORTS):
        if raw.isdigit():
            ports.setdefault(int(raw), "a demo engine (NEXUS_DEMO_PORTS)")
    redis = urlsplit(settings.REDIS_URL)
    if redis.scheme in ("redis", "rediss"):
        ports.setdefault(redis.port or 6379, "Redis (REDIS_URL)")
    return ports
