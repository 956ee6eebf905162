"""{% autoscaling_cards service %}: the service page's autoscaling rules and scale events."""

from __future__ import annotations

from typing import Any

from django import template
from django.template import Context

from serving.autoscaling_views import cards_context
from serving.models import Service

register = template.Library()


@register.inclusion_tag("serving/autoscaling_cards.html", takes_context=True)
def autoscaling_cards(context: Context, service: Service) -> dict[str, Any]:
    """Render both cards for the page's request (its filter and page of rules)."""
    request = context["request"]
    return {**cards_context(request, service), "request": request, "user": request.user}
