"""Websocket consumers of the serving pages: authenticate, join a group, forward."""

from __future__ import annotations

from typing import Any

from nexus import access, live
from nexus.consumers import LiveConsumer
from serving import live as serving_live
from serving import trials
from serving.models import Service, Trial


class ServicesConsumer(LiveConsumer):
    """Forward re-rendered service rows to a staff member's services list.

    A row is rendered once with its owner and controls, so it goes to staff only; anyone else's
    list opens no socket and is refused one (as the pools page).
    """

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        return serving_live.SERVICES_TOPIC if access.is_staff(user) else None

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return serving_live.current_rows()


class ServiceConsumer(LiveConsumer):
    """Forward a service page's re-rendered cards to those who see the service's project."""

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        service = Service.objects.filter(pk=url["pk"]).values_list("project", flat=True).first()
        if service is None or not access.sees_named_project(user, service):
            return None
        return serving_live.service_topic(url["pk"])

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return serving_live.service_cards(url["pk"], audience)


class TrialConsumer(LiveConsumer):
    """Forward a Validate trial's popup body to staff (who alone may start trials)."""

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        if not access.is_staff(user) or not Trial.objects.filter(pk=url["pk"]).exists():
            return None
        return trials.topic(url["pk"])

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        trial = Trial.objects.select_related("node").filter(pk=url["pk"]).first()
        return live.fragment(trials.TRIAL_POPUP, {"trial": trial}) if trial else ""
