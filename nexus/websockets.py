"""Websocket admission: pages of this very Nexus only, and a clean close for unknown paths."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.generic.websocket import AsyncWebsocketConsumer
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin1")
    return None


def _host_and_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    """Return (host, port) of a host[:port], the scheme's default port when none is given."""
    host, port = split_domain_port(netloc.lower())
    if not host:
        return None
    if not port:
        return host, DEFAULT_PORTS.get(scheme, 80)
    return (host, int(port)) if port.isdigit() else None


def same_origin(scope: dict[str, Any]) -> bool:
    """Say whether the socket was opened by a page of this Nexus.

    The Origin's host *and port* must equal the Host the socket came to (a page served by another
    local program on another port is another site), and that host must be an allowed one; or
    the Origin is listed whole in CSRF_TRUSTED_ORIGINS (a proxy that changes the Host).
    """
    origin, host = _header(scope, b"origin"), _header(scope, b"host")
    if origin is None or host is None:
        return False
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parsed = urlsplit(origin)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return False
    secure = scope.get("scheme") in ("wss", "https")
    page = _host_and_port(parsed.netloc, parsed.scheme)
    served = _host_and_port(host, "https" if secure else "http")
    return page is not None and page == served and validate_host(page[0], settings.ALLOWED_HOSTS)


class SameOriginOnly:
    """Refuse (close before accepting) a websocket that `same_origin` does not admit."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not same_origin(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)


class UnknownPath(AsyncWebsocketConsumer):
    """The last route: a socket to a path nothing serves is closed (4404), not a traceback."""

    async def connect(self) -> None:
        await self.close(code=4404)
