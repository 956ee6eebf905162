"""Autoscaling on the service page: the rules card and the scale events card (one included
template, `{% autoscaling_cards service %}`), the rule editor, and the Prometheus preview."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from nexus.pages import HtmxHttpRequest, require_staff
from serving import scaling, services
from serving.autoscaling import KERNEL_METRICS, MetricSource
from serving.forms import AutoScalingRuleForm, preset_filled
from serving.models import MIN_IDLE_S, AutoScalingRule, ScaleEvent, Service, ServiceLifecycle
from serving.views import service_or_404

CARDS = "serving/autoscaling_cards.html"
RULES_CARD = f"{CARDS}#autoscaling-rules"
EVENTS_CARD = f"{CARDS}#scale-events"
EDITOR = "serving/autoscaling_rule_form.html"
PREVIEW = f"{EDITOR}#rule-preview"
RULES_PER_PAGE = 10
EVENTS_SHOWN = 20
FILTERS = tuple(scaling.RANGE_LOOKUPS)


def rules_context(request: HttpRequest, service: Service) -> dict[str, Any]:
    """Return what the rules card shows: one page of the rules within the filter's ranges."""
    rules = AutoScalingRule.objects.filter(service=service).order_by("pk")
    problem = ""
    try:
        rules = scaling.in_ranges(rules, request.GET)
    except scaling.BadRange as bad:
        problem = f"{bad.name.replace('_', ' ').capitalize()}: {bad}"
    page = Paginator(rules, RULES_PER_PAGE).get_page(request.GET.get("rules_page"))
    kept = QueryDict(mutable=True)
    for name in FILTERS:
        if request.GET.get(name):
            kept[name] = request.GET[name]
    return {
        "service": service,
        "sleep": scaling.sleep_state(service),
        "rules_page": page,
        "filters": {name: request.GET.get(name, "") for name in FILTERS},
        "filtered": bool(kept),
        "filter_query": kept.urlencode(),
        "filter_problem": problem,
        "can_change": request.user.is_staff and service.lifecycle == ServiceLifecycle.ACTIVE,
        "min_idle_s": MIN_IDLE_S,
        "idle_value": ""
        if service.scale_to_zero_after_s is None
        else service.scale_to_zero_after_s,
        "idle_problem": "",
    }


def events_context(service: Service) -> dict[str, Any]:
    """Return what the scale events card shows: the latest events, newest first."""
    events = ScaleEvent.objects.filter(service=service).select_related("rule")
    return {
        "service": service,
        "events": list(events.order_by("-created_at", "-id")[:EVENTS_SHOWN]),
    }


def cards_context(request: HttpRequest, service: Service) -> dict[str, Any]:
    """Return what both cards show, as the service page includes them."""
    return {**rules_context(request, service), **events_context(service)}


@require_GET
@login_required
def autoscaling_rules(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Render the rules card (a filter or a page of it); without htmx, go to the service page."""
    service = service_or_404(request, name)
    if not request.htmx:
        url = reverse("serving:service_detail", args=[service.name])
        query = request.GET.urlencode()
        return redirect(f"{url}?{query}#autoscaling-rules" if query else f"{url}#autoscaling-rules")
    return render(request, RULES_CARD, rules_context(request, service))


@require_POST
@login_required
def scale_to_zero_setting(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Set after how many idle seconds the service scales to zero (blank: never). The rules
    card comes back with the setting, or with the problem next to its field."""
    service = service_or_404(request, name)
    require_staff(request, "change services")
    value = request.POST.get("scale_to_zero_after_s", "").strip()
    problem = ""
    idle_s: int | None = None
    if value:
        try:
            idle_s = int(value)
        except ValueError:
            problem = "Enter a whole number of seconds, or leave it blank for never."
        else:
            if idle_s < MIN_IDLE_S:
                problem = f"At least {MIN_IDLE_S} s, or blank for never."
    if not problem:
        try:
            services.update_service(service, scale_to_zero_after_s=idle_s)
        except services.ServiceError as refused:
            problem = str(refused)
    if not request.htmx:
        if problem:
            messages.error(request, f"Scale to zero: {problem}")
        url = reverse("serving:service_detail", args=[service.name])
        return redirect(f"{url}#autoscaling-rules")
    service.refresh_from_db()
    context = rules_context(request, service)
    if problem:
        context.update(idle_value=value, idle_problem=problem)
    return render(request, RULES_CARD, context)


@require_GET
@login_required
def scale_events(request: HttpRequest, name: str) -> HttpResponse:
    """Render the scale events card (it refreshes itself every few seconds)."""
    service = service_or_404(request, name)
    return render(request, EVENTS_CARD, events_context(service))


def _editor(
    request: HtmxHttpRequest, service: Service, rule: AutoScalingRule | None
) -> HttpResponse:
    """Show the rule editor; save the rule on POST (then back to the service page)."""
    require_staff(request, "change autoscaling rules")
    if service.lifecycle != ServiceLifecycle.ACTIVE:
        messages.error(request, f"{service.name} is being destroyed: its rules cannot change.")
        return redirect("serving:service_detail", name=service.name)
    if request.method == "POST":
        form = AutoScalingRuleForm(request.POST, instance=rule, service=service)
        if form.is_valid():
            saved = form.save()
            verb = "Saved" if rule else "Added"
            messages.success(request, f"{verb} the rule: {saved.describe()}.")
            url = reverse("serving:service_detail", args=[service.name])
            return redirect(f"{url}#autoscaling-rules")
    elif "redraw" in request.GET:
        # The source or the preset changed: fill the preset in, show the fields that apply.
        form = preset_filled(request.GET, service, rule)
    else:
        form = AutoScalingRuleForm(instance=rule, service=service)
    preview = None
    if form.is_prometheus:
        query = form["prometheus_query"].value()
        window = _window(form["window_s"].value())
        preview = scaling.preview(service, str(query), window) if query else None
    context = {
        "service": service,
        "rule": rule,
        "form": form,
        "preview": preview,
        "kernel_metrics": KERNEL_METRICS,
        "prometheus": MetricSource.PROMETHEUS,
    }
    return render(request, EDITOR, context)


def _window(value: Any) -> int:
    try:
        return min(max(int(value), 10), 3600)
    except (TypeError, ValueError):
        return 60


@require_http_methods(["GET", "POST"])
@login_required
def autoscaling_rule_new(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Add an autoscaling rule to the service."""
    return _editor(request, service_or_404(request, name), None)


@require_http_methods(["GET", "POST"])
@login_required
def autoscaling_rule_edit(request: HtmxHttpRequest, name: str, rule_id: int) -> HttpResponse:
    """Change one of the service's autoscaling rules."""
    service = service_or_404(request, name)
    return _editor(request, service, get_object_or_404(service.autoscaling_rules, pk=rule_id))


@require_http_methods(["GET", "POST"])
@login_required
def autoscaling_rule_delete(request: HttpRequest, name: str, rule_id: int) -> HttpResponse:
    """Ask to confirm deleting a rule; delete it on POST (its scale events are kept)."""
    service = service_or_404(request, name)
    require_staff(request, "change autoscaling rules")
    rule = get_object_or_404(service.autoscaling_rules, pk=rule_id)
    if request.method == "POST":
        described = rule.describe()
        rule.delete()
        messages.success(request, f"Deleted the rule: {described}.")
        url = reverse("serving:service_detail", args=[service.name])
        return redirect(f"{url}#autoscaling-rules")
    events = rule.events.count()
    return render(
        request,
        "serving/autoscaling_rule_delete.html",
        {"service": service, "rule": rule, "event_count": events},
    )


@require_GET
@login_required
def autoscaling_preview(request: HttpRequest, name: str) -> HttpResponse:
    """Render the current value of the editor's Prometheus query, run now."""
    service = service_or_404(request, name)
    query = request.GET.get("prometheus_query", "")
    window = _window(request.GET.get("window_s"))
    preview = scaling.preview(service, query, window) if query else None
    return render(request, PREVIEW, {"service": service, "preview": preview})
