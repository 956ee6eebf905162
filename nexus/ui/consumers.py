"""The style guide's websocket: the live-page pattern in its smallest form."""

from __future__ import annotations

from typing import Any

from nexus import live
from nexus.consumers import LiveConsumer
from nexus.ui.views import KIT_TOPIC, kit_live


class KitConsumer(LiveConsumer):
    """Forward the kit's live part to staff on the style guide."""

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        return KIT_TOPIC if user.is_staff else None

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return kit_live()
