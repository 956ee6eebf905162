"""A pool's page: its targets live (state, health, load, queue), drain and resume, its targets'
inline edit, adding and removing targets, its settings.

The live card is the page's partial `pools/pool_detail.html#pool-live`, rendered by
`pool_live` for the first render and for every tick of the page's socket (PoolPageConsumer).
Actions post plainly (POST, redirect, GET with a toast): the card they sit in is replaced every
second, which would drop an htmx answer.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from nexus import access, live, scopes
from nexus.auth import acting_user
from nexus.models import ApiToken
from nexus.pages import HtmxHttpRequest, render_page_or_fragment
from nexus.ui import charts
from pools import console, services, traffic, validation
from pools.forms import (
    DrillForm,
    DryRunForm,
    PoolSettingsForm,
    TargetAddForm,
    TargetTrafficForm,
    TryTrafficForm,
    ValidateForm,
)
from pools.models import Pool, Target, TrafficRun, TrafficRunKind
from pools.views import visible_pools

POOL_DETAIL = "pools/pool_detail.html"
POOL_LIVE = f"{POOL_DETAIL}#pool-live"
POOL_SETTINGS = "pools/pool_settings.html"
TARGET_ADD = "pools/target_add.html"
TARGET_REMOVE = "pools/target_remove.html"
VALIDATE = "pools/validate.html"
TRAFFIC_FORM = "pools/traffic_form.html"
RUN_DETAIL = "pools/run_detail.html"
RUN_LIVE = f"{RUN_DETAIL}#run-live"
DRY_RUN = "pools/dry_run.html"
DRY_RUN_RESULT = f"{DRY_RUN}#dry-run-result"

__all__ = ["may_operate", "pool_live", "run_live", "seen_pools"]


def may_operate(user: Any, pool: Pool) -> bool:
    """Say whether the user may drain, resume and edit the pool: a changing role in its project,
    and no service owning it (its service sets its targets)."""
    return not pool.managed and access.may_change(user, pool.project.name)


def pool_live(slug: str, *, can_manage: bool) -> str:
    """Return the pool page's live card as it is now, for a socket; empty once the pool is gone."""
    pool = Pool.objects.select_related("project").filter(slug=slug).first()
    if pool is None:
        return ""
    return live.fragment(POOL_LIVE, console.pool_live_context(pool, can_manage=can_manage))


@require_GET
@login_required
def pool_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """Render one pool's targets live, its settings, and how to call it (404 outside the user's
    projects, so that no name leaks)."""
    pool = seen_pool(request.user, slug)
    tokens = calling_tokens(request, pool)
    context = console.pool_live_context(pool, can_manage=may_operate(request.user, pool))
    # The inline edit sits outside the live card, which would replace what is being typed.
    edits = [
        (row.target, TargetTrafficForm(instance=row.target, prefix=f"target-{row.target.pk}"))
        for row in context["rows"]
    ]
    page = {
        **context,
        "tokens": tokens,
        "edits": edits,
        "dry_run_form": DryRunForm(),
        "identity_confirmation": pool.identity_confirmations.first(),
        "drills": pool.traffic_runs.filter(kind=TrafficRunKind.DRILL)[:5],
    }
    return render(request, POOL_DETAIL, page)


def calling_tokens(request: HttpRequest, pool: Pool) -> list[ApiToken]:
    """Return the user's usable tokens that may call the pool, for the snippets' token picker."""
    # Only a prefix to recognise each by: a token's secret is never stored.
    return [
        token
        for token in ApiToken.objects.usable().filter(created_by=acting_user(request))
        if token.may_call(scopes.pool(pool.slug))
    ]


def seen_pools(user: Any) -> QuerySet[Pool]:
    """Return the pools the user may see, with their projects."""
    # Without the list's prefetch: a pool's pages read its targets once, with their nodes.
    return visible_pools(user).prefetch_related(None).select_related("project")


def seen_pool(user: Any, slug: str) -> Pool:
    """Return the pool with its project if the user may see it, else 404 (no name leaks)."""
    return get_object_or_404(seen_pools(user), slug=slug)


def operated_pool(request: HttpRequest, slug: str) -> Pool:
    """Return the pool the user may operate: 404 when they cannot see it, 403 when they may
    only read it."""
    pool = seen_pool(request.user, slug)
    if not may_operate(request.user, pool):
        if pool.managed:
            raise PermissionDenied("Its model service manages this pool's targets.")
        raise PermissionDenied(access.ProjectRoles.message)
    return pool


def pool_target(pool: Pool, pk: int) -> Target:
    return get_object_or_404(pool.targets.select_related("node"), pk=pk)


@require_POST
@login_required
def target_drain(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    """Stop new requests to one target; those in flight finish."""
    target = services.drain_target(pool_target(operated_pool(request, slug), pk))
    messages.success(request, f"{target.name} is draining: it takes no new requests.")
    return redirect("pools:detail", slug)


@require_POST
@login_required
def target_resume(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    """Return one target to service, or say why it may not."""
    target = pool_target(operated_pool(request, slug), pk)
    try:
        services.resume_target(target)
    except services.CannotResume as refusal:
        messages.error(request, f"Not resumed: {refusal}")
    else:
        messages.success(request, f"{target.name} is active again.")
    return redirect("pools:detail", slug)


@require_POST
@login_required
def pool_drain(request: HttpRequest, slug: str) -> HttpResponse:
    """Drain every active target of the pool."""
    started = services.drain_pool(operated_pool(request, slug))
    names = ", ".join(target.name for target in started) or "none were active"
    messages.success(request, f"Draining the whole pool: {names}.")
    return redirect("pools:detail", slug)


@require_POST
@login_required
def pool_resume(request: HttpRequest, slug: str) -> HttpResponse:
    """Resume every draining or drained target that may; say why each other one may not."""
    resumed, refusals = services.resume_pool(operated_pool(request, slug))
    if resumed:
        messages.success(request, f"Resumed: {', '.join(target.name for target in resumed)}.")
    for refusal in refusals:
        messages.error(request, f"Not resumed: {refusal}")
    return redirect("pools:detail", slug)


@require_POST
@login_required
def target_edit(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    """Change a target's priority, capacity weight or enabled in place."""
    target = pool_target(operated_pool(request, slug), pk)
    form = TargetTrafficForm(request.POST, instance=target, prefix=f"target-{pk}")
    if form.is_valid():
        services.update_target(target, {name: form.cleaned_data[name] for name in form.fields})
        messages.success(request, f"{target.name} saved.")
    else:
        problems = "; ".join(
            f"{form.fields[name].label}: {' '.join(str(error) for error in errors)}"
            for name, errors in form.errors.items()
        )
        messages.error(request, f"{target.name} not saved: {problems}")
    return redirect("pools:detail", slug)


@login_required
def target_add(request: HttpRequest, slug: str) -> HttpResponse:
    """Add an endpoint to the pool, with its own key."""
    pool = operated_pool(request, slug)
    form = TargetAddForm(request.POST or None, pool=pool)
    if request.method == "POST" and form.is_valid():
        fields = {name: form.cleaned_data[name] for name in TargetAddForm.Meta.fields}
        said = ""
        if fields["capacity_weight"] is None:
            # Prefilled from what the runtime runs at once, where it says (docs/pools-console.md).
            detected, source = validation.detect_runtime_concurrency(fields["base_url"])
            fields["capacity_weight"] = detected or TargetAddForm.DEFAULT_CAPACITY
            said = f" Capacity {fields['capacity_weight']}: " + (
                source if detected else "its runtime does not say what it runs at once"
            )
        target = services.add_target(pool, fields, credential=form.cleaned_data["credential"])
        messages.success(request, f"{target.name} added to {pool.name}.{said}")
        return redirect("pools:detail", slug)
    status = 400 if request.method == "POST" else 200
    return render(request, TARGET_ADD, {"pool": pool, "form": form}, status=status)


@login_required
def target_remove(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    """Confirm, then remove a target from the pool."""
    pool = operated_pool(request, slug)
    target = pool_target(pool, pk)
    if request.method == "POST":
        services.remove_target(target)
        messages.success(request, f"{target.name} removed from {pool.name}.")
        return redirect("pools:detail", slug)
    return render(request, TARGET_REMOVE, {"pool": pool, "target": target})


@login_required
def pool_settings(request: HttpRequest, slug: str) -> HttpResponse:
    """Edit the pool's strategy, queue, retries, continuity, timeouts and history."""
    pool = operated_pool(request, slug)
    form = PoolSettingsForm(request.POST or None, instance=pool)
    if request.method == "POST" and form.is_valid():
        changes = {name: form.cleaned_data[name] for name in form.changed_data}
        services.update_pool_settings(pool, changes)
        messages.success(request, f"{pool.name}'s settings saved.")
        return redirect("pools:detail", slug)
    status = 400 if request.method == "POST" else 200
    return render(request, POOL_SETTINGS, {"pool": pool, "form": form}, status=status)


@require_GET
@login_required
def dry_run(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """Rank the pool's targets for a sample request as the strategy would now; route nothing.

    The page's form asks with htmx and gets the result's partial; without JavaScript, the page.
    """
    pool = seen_pool(request.user, slug)
    form = DryRunForm(request.GET or None)
    ranking = None
    if form.is_valid():
        asked = form.cleaned_data
        headers = {"x-nexus-session-id": asked["session_id"]} if asked["session_id"] else {}
        ranking = services.dry_run(pool, kind=asked["kind"], headers=headers, body={})
    context = {"pool": pool, "form": form, "ranking": ranking}
    return render_page_or_fragment(request, DRY_RUN, DRY_RUN_RESULT, context)


@require_GET
@login_required
def validate(request: HttpRequest, slug: str) -> HttpResponse:
    """Show the Validate form, and the report once asked (nothing changes: a GET)."""
    pool = seen_pool(request.user, slug)
    form = ValidateForm(request.GET or None)
    report = None
    can_manage = may_operate(request.user, pool)
    # Validate calls every target (real inference when probing): those who may change the pool.
    if form.is_valid() and can_manage:
        report = validation.validate(pool, probe_kinds=form.cleaned_data["probe_kinds"])
    context = {
        "pool": pool,
        "form": form,
        "report": report,
        "confirmation": pool.identity_confirmations.first(),
        "can_manage": can_manage,
    }
    return render(request, VALIDATE, context)


@require_POST
@login_required
def confirm_identity(request: HttpRequest, slug: str) -> HttpResponse:
    """Store the operator's word that the pool's targets serve one model."""
    pool = operated_pool(request, slug)
    confirmation = validation.confirm_identity(pool, request.user)
    count = len(confirmation.targets)
    messages.success(request, f"Confirmed: the {count} targets of {pool.name} serve one model.")
    return redirect(f"{reverse('pools:validate', args=[slug])}?run=1")


def traffic_params(form: TryTrafficForm) -> dict[str, Any]:
    return {name: form.cleaned_data[name] for name in TryTrafficForm.base_fields}


@login_required
def try_traffic(request: HttpRequest, slug: str) -> HttpResponse:
    """Send N real requests through the pool's gateway and watch where they go."""
    pool = operated_pool(request, slug)
    form = TryTrafficForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        run = services.start_traffic(pool, TrafficRunKind.TRY, traffic_params(form), request.user)
        return redirect("pools:run", slug, run.pk)
    status = 400 if request.method == "POST" else 200
    context = {"pool": pool, "form": form, "kind": TrafficRunKind.TRY}
    return render(request, TRAFFIC_FORM, context, status=status)


@login_required
def failure_drill(request: HttpRequest, slug: str) -> HttpResponse:
    """Drain one target under traffic and resume it: did the pool avoid it and take it back?"""
    pool = operated_pool(request, slug)
    form = DrillForm(request.POST or None, pool=pool)
    if request.method == "POST" and form.is_valid():
        target = pool_target(pool, int(form.cleaned_data["target"]))
        params = traffic_params(form)
        run = services.start_traffic(
            pool, TrafficRunKind.DRILL, params, request.user, target=target
        )
        return redirect("pools:run", slug, run.pk)
    status = 400 if request.method == "POST" else 200
    context = {"pool": pool, "form": form, "kind": TrafficRunKind.DRILL}
    return render(request, TRAFFIC_FORM, context, status=status)


def run_context(run: TrafficRun) -> dict[str, Any]:
    """Return what the run's live card needs: each phase's counts, shares and TTFT."""
    phases = [
        {
            **phase,
            "chart": charts.share_chart(
                f"Requests per target · {phase['name']}", sorted(phase["by_target"].items())
            ),
            "ttft_p50_ms": traffic.ttft_p50(phase),
        }
        for phase in run.phases
    ]
    return {"run": run, "pool": run.pool, "phases": phases}


def run_live(slug: str, pk: int) -> str:
    """Return a run's live card as it is now, for its page's socket."""
    run = TrafficRun.objects.select_related("pool").filter(pk=pk, pool__slug=slug).first()
    if run is None:
        return ""
    return live.fragment(RUN_LIVE, run_context(run))


@require_GET
@login_required
def run_detail(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    """Show a Try traffic or drill run, live while it runs."""
    pool = seen_pool(request.user, slug)
    run = get_object_or_404(pool.traffic_runs.select_related("pool"), pk=pk)
    return render(request, RUN_DETAIL, run_context(run))
