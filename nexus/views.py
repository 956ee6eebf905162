"""Pages and endpoints that belong to no single app."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET

from nexus import services
from pools import services as pool_services


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return redirect("pools:list")


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Report the database, Redis, worker and this process's gateway; 503 only when Nexus cannot
    serve."""
    healthy, report = services.health_report()
    gateway = pool_services.gateway_health()
    if gateway is not None:
        report["gateway"] = gateway
        if gateway["status"] != "ok" and report["status"] == "ok":
            report["status"] = "degraded"
    return JsonResponse(report, status=200 if healthy else 503)
