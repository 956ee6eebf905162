"""Django messages reach htmx requests as toasts, since such a response is no page to show them."""

from __future__ import annotations

import json
from collections.abc import Callable

from django.contrib import messages
from django.http import HttpRequest, HttpResponse

# The event nexus.js turns into toasts; its detail's "toasts" is a list of {"text", "level"}.
TOAST_EVENT = "nexus:toasts"


class HtmxMessagesMiddleware:
    """Move the messages of an htmx request into the response's HX-Trigger header.

    Listed after MessageMiddleware: the messages read here are then marked as shown.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not getattr(request, "htmx", False) or response.status_code in range(300, 400):
            # A full page (or the one a redirect leads to) shows them itself.
            return response
        toasts = [
            {"text": str(message), "level": message.level_tag}
            for message in messages.get_messages(request)
        ]
        if toasts:
            # Fired on the body: a live push may have replaced the element that made the request.
            event = {"target": "body", "toasts": toasts}
            response["HX-Trigger"] = json.dumps({**_triggers(response), TOAST_EVENT: event})
        return response


def _triggers(response: HttpResponse) -> dict[str, object]:
    """Return the events a view already set in HX-Trigger, as a dict."""
    header = response.get("HX-Trigger", "")
    if header.startswith("{"):
        return dict(json.loads(header))
    return {name.strip(): None for name in header.split(",") if name.strip()}
