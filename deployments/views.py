"""Deployments pages: the list, a form to start one, and its detail, live over /ws/deployments/."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from deployments import live as deployments_live
from deployments import services
from deployments.forms import DeploymentForm
from deployments.models import Deployment
from nexus import live
from nexus.auth import acting_user
from nexus.pages import HtmxHttpRequest, render_page_or_fragment, staff_required

DETAIL = "deployments/deployment_detail.html"
LIVE_SECTION = f"{DETAIL}#deployment-live"


def detail_context(request: HttpRequest, pk: int) -> dict[str, Any]:
    """Return what the detail page and its live section show, or raise Http404."""
    deployment = deployments_live.with_nodes(pk)
    if deployment is None:
        raise Http404(f"No deployment {pk}.")
    return {"deployment": deployment, "can_manage": live.audience_of(request.user) == "manage"}


@require_GET
@login_required
def deployment_list(request: HttpRequest) -> HttpResponse:
    """List deployments, newest first, with their overall state."""
    deployments = Deployment.objects.prefetch_related("nodes__node")[:200]
    return render(request, "deployments/deployment_list.html", {"deployments": deployments})


@require_http_methods(["GET", "POST"])
@staff_required("start or retry deployments")
def deployment_create(request: HttpRequest) -> HttpResponse:
    """Show the form; on a valid post create the deployment and go to its page."""
    form = DeploymentForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            deployment = services.create_deployment(**form.cleaned_data, user=acting_user(request))
        except ValidationError as invalid:
            form.add_error(None, invalid)
        else:
            return redirect("deployments:detail", pk=deployment.pk)
    return render(request, "deployments/deployment_form.html", {"form": form})


@require_GET
@login_required
def deployment_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Render a deployment with one row per node, or only its live section for htmx."""
    return render_page_or_fragment(request, DETAIL, LIVE_SECTION, detail_context(request, pk))


@require_POST
@staff_required("start or retry deployments")
def deployment_retry(request: HttpRequest, pk: int) -> HttpResponse:
    """Retry the failed nodes, say so in a toast, and go back to the page."""
    deployment = detail_context(request, pk)["deployment"]
    try:
        rows = services.retry_failed(deployment)
    except (services.CannotRetry, ValidationError) as refusal:
        notice, level = " ".join(getattr(refusal, "messages", [str(refusal)])), messages.ERROR
    else:
        names = ", ".join(row.node.name for row in rows)
        notice, level = f"Retrying the failed nodes: {names}.", messages.SUCCESS
    messages.add_message(request, level, notice)
    return redirect("deployments:detail", pk=pk)
