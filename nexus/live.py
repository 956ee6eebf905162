"""The one typed gateway from the apps to the live pages' channel layer groups.

A live page watches one *topic* (e.g. "pools", "deployment-12"). Whatever changes what the page
shows renders the page's own partial again (`fragment`, the same template partial the page
includes, marked `hx-swap-oob`) and pushes it under a *key* naming what it replaces; open pages
swap it in by its id. The page's consumer (`nexus.consumers.LiveConsumer`) sends at most about one
frame a second, merging pushes by key, and sends the current state whenever a socket (re)connects.

A fragment that differs by what the viewer may do (a staff-only button) is rendered once per
*audience* and pushed to that audience's group; everything else goes to the topic's group.
docs/ui.md, "Live pages", has the recipe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.template.loader import render_to_string

logger = logging.getLogger(__name__)

Audience = Literal["manage", "view"]
AUDIENCES: tuple[Audience, ...] = ("manage", "view")


class Fragments(TypedDict):
    """Page partials rendered again, for open pages to swap in by their ids."""

    type: Literal["live.fragments"]
    # What the html replaces: of two pushes with one key, a page that is sent neither yet
    # gets only the later.
    key: str
    html: str


def audience_of(user: Any) -> Audience:
    """Return whose version of the fragments a signed-in user sees: staff may manage."""
    return "manage" if getattr(user, "is_staff", False) else "view"


def group(topic: str, audience: Audience | None = None) -> str:
    """Return the channel layer group of a topic's open pages (of one audience, if given)."""
    return f"live.{topic}.{audience}" if audience else f"live.{topic}"


def fragment(partial: str, context: dict[str, Any]) -> str:
    """Render a page's partial for a push: the page's own template, marked out of band."""
    return render_to_string(partial, {**context, "oob": True})


def send(group_name: str, message: Fragments) -> None:
    """Send a message to a group; a missing channel layer must not fail the caller's work."""
    try:
        layer = get_channel_layer()
        if layer is not None:  # None only without CHANNEL_LAYERS, which settings always set
            async_to_sync(layer.group_send)(group_name, dict(message))
    except Exception:
        logger.warning("could not send %s to group %s", message["type"], group_name, exc_info=True)


def push(topic: str, key: str, html: str, *, audience: Audience | None = None) -> None:
    """Push rendered fragments to every open page of the topic (or of one audience)."""
    send(group(topic, audience), {"type": "live.fragments", "key": key, "html": html})


def push_each_audience(topic: str, key: str, render: Callable[[Audience], str]) -> None:
    """Push fragments rendered once per audience, each to its own pages."""
    for audience in AUDIENCES:
        push(topic, key, render(audience), audience=audience)
