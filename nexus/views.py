"""Pages and endpoints that belong to no single app."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET

from nexus import services


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return redirect("pools:list")


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Report the database, Redis and worker; 503 only when Nexus cannot serve."""
    healthy, report = services.health_report()
    return JsonResponse(report, status=200 if healthy else 503)
