"""What the apps' HTML views share: the htmx-aware request type, the staff check, and rendering
one view's page or its fragment."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django_htmx.middleware import HtmxDetails

View = Callable[..., HttpResponse]


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def require_staff(request: HttpRequest, doing: str) -> None:
    """Refuse (403) a change by someone who is not staff, as the API refuses their writes."""
    if not request.user.is_staff:
        raise PermissionDenied(f"Only staff may {doing}.")


def staff_required(doing: str) -> Callable[[View], View]:
    """Return a decorator that sends anonymous users to sign in and refuses anyone but staff."""

    def decorator(view: View) -> View:
        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            require_staff(request, doing)
            return view(request, *args, **kwargs)

        return login_required(checked)

    return decorator


def render_page_or_fragment(
    request: HtmxHttpRequest, page: str, fragment: str, context: dict[str, Any]
) -> HttpResponse:
    """Render the whole page, or only its fragment for an htmx request."""
    response = render(request, fragment if request.htmx else page, context)
    # The same URL answers two ways: caches must keep them apart.
    patch_vary_headers(response, ["HX-Request"])
    return response
