"""ASGI entry point: /v1 and /serve to the gateway, websockets to consumers, the rest to Django."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from typing import Any

from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nexus.settings")
# Nexus serves its own static files (one command, no separate web server); only /static/ paths
# take this detour.
django_app = ASGIStaticFilesHandler(get_asgi_application())

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from nexus import eager_writes, graceful, upload_guard  # noqa: E402
from nexus.routing import websocket_urlpatterns  # noqa: E402
from nexus.websockets import SameOriginOnly  # noqa: E402
from pools.gateway import limits  # noqa: E402
from pools.gateway.app import Gateway, Receive, Send  # noqa: E402


def silence_daphne_access_log() -> None:
    """Stop daphne's access log at its source unless NEXUS_ACCESS_LOG asks for it: its command
    line writes a line per request to stdout, and silencing a logger does not stop that."""
    if settings.NEXUS_ACCESS_LOG:
        return
    from daphne.server import Server

    Server.log_action = lambda self, protocol, action, details: None


def install_in_daphne(gateway: Gateway) -> None:
    silence_daphne_access_log()
    upload_guard.install_in_daphne()
    graceful.install_in_daphne(gateway.shutdown)
    # Every request is judged from its headers before any work, under daphne as under uvicorn.
    limits.install_in_daphne(gateway)
    # A streamed chunk leaves when it is written, not a reactor turn later (as under uvicorn).
    eager_writes.install_in_daphne()


# `kill -USR1 <pid>` writes every thread's stack to stderr: what a stuck process is doing.
faulthandler.register(signal.SIGUSR1, all_threads=True)
gateway = Gateway()
# A body larger than any upload is refused before it is read: Django would read it all first.
guarded_django_app = upload_guard.guard(django_app)
# daphne's command imports its server before it loads the app; under uvicorn nothing imports
# daphne or Twisted (0.3 s of a start).
if "daphne.server" in sys.modules:
    install_in_daphne(gateway)
limits.install_in_uvicorn()


async def http_router(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """Send /v1 and /serve to the gateway without touching Django's request machinery."""
    if scope["path"].startswith(("/v1/", "/serve/")):
        await gateway(scope, receive, send)
    else:
        await guarded_django_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": limits.guard(http_router),
        "lifespan": graceful.lifespan(gateway.shutdown),
        "websocket": SameOriginOnly(
            # types-channels asks for its own private pattern type; Django's path() makes these.
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))  # type: ignore[arg-type]
        ),
    }
)
