"""Websocket consumers of the serving pages: authenticate, join a group, forward."""

from __future__ import annotations

from typing import Any

from nexus import access, live
from nexus.consumers import LiveConsumer
from serving import live as serving_live


class ServicesConsumer(LiveConsumer):
    """Forward re-rendered service rows to a staff member's services list.

    A row is rendered once with its owner and controls, so it goes to staff only; anyone else's
    list opens no socket and is refused one (as the pools page).
    """

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        return serving_live.SERVICES_TOPIC if access.is_staff(user) else None

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return serving_live.current_rows()
