"""The create-pool wizard: the document's nine steps, one screen each (docs/pools-console.md).

`/pools/new/` starts a draft and opens its first step, `/pools/new/<draft>/<step>/`. Each step
posts its form: Next saves it to the draft and opens the next step, Back saves what is valid and
opens the one before; errors sit next to their fields. The summary's Create makes the pool
through `pools.services` (pools.wizard.save), then `/pools/<slug>/created/` shows how to call it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError
from django.forms import BaseForm
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from nexus import access
from nexus.models import default_project_pk
from nexus.pages import HtmxHttpRequest, require_staff
from nodes import services as node_services
from nodes.forms import NodeAddForm
from nodes.models import Node, NodeTrust
from pools import validation, wizard
from pools.forms import (
    CompatibilityForm,
    DraftTargetForm,
    DryRunForm,
    IdentityConfirmForm,
    NodesForm,
    PoolCreateForm,
    PoolNameForm,
    StrategyForm,
    ValidateForm,
    WeightsForm,
)
from pools.models import Pool
from pools.pool_views import calling_tokens, seen_pool

TEMPLATE = "pools/wizard.html"
SLUG_CHECK = f"{TEMPLATE}#slug-check"
REPORT = "pools/validate.html#report"
DRY_RUN_RESULT = "pools/dry_run.html#dry-run-result"
CREATED = "pools/wizard_created.html"


# Why a target's capacity was not prefilled, by where it runs: the operator sets it.
UNDETECTED = {
    wizard.Source.NODE: "4 by default: a node's agent answers for several runtimes and does not "
    "say what one runs at once; set what its runtime runs.",
    wizard.Source.RUNTIME: "4 by default: its runtime does not say what it runs at once (vLLM, "
    "Ollama); set what it runs.",
    wizard.Source.PROVIDER: "4 by default: a provider does not say; set what your account "
    "is allowed at once.",
}


def may_create(request: HttpRequest) -> None:
    """Refuse (403) someone who may change no project: a pool lives in one."""
    # The default project exists from its first use on: staff may create there on a fresh
    # installation too (before, a database without a project refused staff as well).
    default_project_pk()
    if not access.changeable_projects(request.user).exists():
        raise PermissionDenied(access.ProjectRoles.message)


def step_url(draft_id: str, step: str) -> str:
    return reverse("pools:wizard", args=[draft_id, step])


def the_draft(request: HttpRequest, draft_id: str) -> dict[str, Any]:
    may_create(request)
    draft = wizard.load_draft(request.session, draft_id)
    if draft is None:
        raise Http404("No such draft: it was created already, or it expired.")
    return draft


@require_GET
@login_required
def wizard_start(request: HttpRequest) -> HttpResponse:
    """Start a draft and open its first step."""
    may_create(request)
    draft_id = wizard.new_draft(request.session)
    return redirect(step_url(draft_id, wizard.STEPS[0].slug))


def chosen_nodes(draft: dict[str, Any]) -> list[Node]:
    return list(Node.objects.filter(pk__in=draft["nodes"], trust=NodeTrust.TRUSTED))


def draft_pool(draft: dict[str, Any]) -> Pool:
    """Return an unsaved pool named as the draft says, for the forms' messages."""
    return Pool(name=draft["pool"].get("name") or "The new pool", slug=draft["pool"].get("slug"))


def step_form(request: HttpRequest, draft: dict[str, Any], step: str) -> BaseForm | None:
    """Return the step's form, bound to the post or filled from the draft."""
    data = request.POST if request.method == "POST" else None
    if step == "nodes":
        return NodesForm(data, initial={"nodes": draft["nodes"]})
    if step == "name":
        return PoolNameForm(data, initial=draft["pool"], user=request.user)
    if step == "compatibility":
        return CompatibilityForm(data, initial={"compatibility_mode": draft["compatibility_mode"]})
    if step == "strategy":
        return StrategyForm(data, initial={"strategy": draft["strategy"]})
    if step == "weights":
        return WeightsForm(data, targets=draft["targets"])
    if step == "check":
        problems = wizard.identity_problems(draft)
        return IdentityConfirmForm(
            data,
            initial={"confirm_identity": draft["identity_confirmed"]},
            problems=problems,
            count=len(draft["targets"]),
        )
    return None


def keep(draft: dict[str, Any], step: str, form: BaseForm) -> None:
    """Store a valid step form's values in the draft."""
    data = form.cleaned_data
    if step == "nodes":
        draft["nodes"] = [node.pk for node in data["nodes"]]
    elif step == "name":
        draft["pool"] = {
            "name": data["name"],
            "slug": data["slug"],
            "project": data["project"].name,
            "description": data["description"],
        }
    elif step == "compatibility":
        if data["compatibility_mode"] != draft["compatibility_mode"]:
            draft["identity_confirmed"] = False  # confirmed for the other mode, if at all
        draft["compatibility_mode"] = data["compatibility_mode"]
    elif step == "strategy":
        draft["strategy"] = data["strategy"]
    elif step == "weights":
        assert isinstance(form, WeightsForm)
        for entry, (priority, capacity) in zip(draft["targets"], form.values(), strict=True):
            entry["priority"], entry["capacity_weight"] = priority, capacity
    elif step == "check":
        draft["identity_confirmed"] = data["confirm_identity"]


def step_problem(draft: dict[str, Any], step: str) -> str:
    """Return why the step cannot be left forward though its form is valid; empty if it can."""
    if step == "targets" and not draft["targets"]:
        return "Add at least one target: a pool with none refuses every request."
    if step in ("compatibility", "targets") and (refusal := wizard.mode_refusal(draft)):
        # Exact replicas chosen (or kept) over targets of different models: refused as
        # services.update_pool_settings refuses it.
        return refusal
    return ""


@require_http_methods(["GET", "POST"])
@login_required
def wizard_step(request: HtmxHttpRequest, draft_id: str, step: str) -> HttpResponse:
    """Show one step of the draft; a post saves it and moves on (Next) or back (Back)."""
    draft = the_draft(request, draft_id)
    if step not in wizard.STEP_SLUGS:
        raise Http404("No such step.")
    index = wizard.STEP_SLUGS.index(step)
    form = step_form(request, draft, step)
    problem = ""
    if request.method == "POST":
        if step == "name" and request.htmx:
            # The live slug check: the whole form is validated, only the slug's verdict is shown.
            assert form is not None
            form.is_valid()
            return render(request, SLUG_CHECK, {"form": form})
        going_back = "back" in request.POST
        if step == wizard.STEP_SLUGS[-1] and not going_back:
            return create(request, draft_id, draft)
        valid = form is None or form.is_valid()
        if valid and form is not None:
            keep(draft, step, form)
            wizard.save_draft(request.session, draft_id, draft)
        if going_back:
            return redirect(step_url(draft_id, wizard.STEP_SLUGS[max(index - 1, 0)]))
        problem = step_problem(draft, step) if valid else ""
        if valid and not problem:
            return redirect(step_url(draft_id, wizard.STEP_SLUGS[index + 1]))
    context = step_context(request, draft_id, draft, step, form)
    context["problem"] = problem
    status = 400 if request.method == "POST" else 200
    return render(request, TEMPLATE, context, status=status)


def step_context(
    request: HttpRequest, draft_id: str, draft: dict[str, Any], step: str, form: BaseForm | None
) -> dict[str, Any]:
    """Return what the step's screen shows: its form, the steps, and what the step needs."""
    index = wizard.STEP_SLUGS.index(step)
    context: dict[str, Any] = {
        "draft_id": draft_id,
        "draft": draft,
        "step": wizard.STEPS[index],
        "steps": [
            {"step": s, "url": step_url(draft_id, s.slug), "number": n + 1, "current": n == index}
            for n, s in enumerate(wizard.STEPS)
        ],
        "number": index + 1,
        "previous": wizard.STEP_SLUGS[index - 1] if index else "",
        "form": form,
        "pool_name": draft["pool"].get("name", ""),
    }
    if step == "nodes":
        context["node_form"] = NodeAddForm()
        context["pending"] = Node.objects.filter(
            name=draft["pending_node"], trust=NodeTrust.PENDING
        ).first()
        context["can_add_nodes"] = request.user.is_staff
    elif step == "targets":
        context["target_form"] = target_form(draft, None)
    elif step == "check":
        context["dry_run_form"] = DryRunForm()
        context["validate_form"] = ValidateForm()
        context["problems"] = wizard.identity_problems(draft)
    elif step == "summary":
        context["summary"] = summary(draft)
        context["blocking"] = blocking(request, draft)
    return context


def target_form(draft: dict[str, Any], data: Any) -> DraftTargetForm:
    taken = [entry["name"] for entry in draft["targets"]]
    nodes = chosen_nodes(draft)
    return DraftTargetForm(
        data, pool=draft_pool(draft), nodes=nodes, taken=taken, replicas_of=wizard.replicas(draft)
    )


# -- the nodes step: add a node inline, with its fingerprint confirmed -------------------------


@require_POST
@login_required
def wizard_node_add(request: HttpRequest, draft_id: str) -> HttpResponse:
    """Add a node as the Nodes page does; its fingerprint is compared on the step next."""
    draft = the_draft(request, draft_id)
    require_staff(request, "change nodes")
    node_form = NodeAddForm(request.POST)
    if node_form.is_valid():
        try:
            node = node_services.add_node(**node_form.cleaned_data)
        except node_services.NodeError as error:
            node_form.add_error(None, str(error))
        else:
            draft["pending_node"] = node.name
            wizard.save_draft(request.session, draft_id, draft)
            return redirect(step_url(draft_id, "nodes"))
    context = step_context(request, draft_id, draft, "nodes", step_form(request, draft, "nodes"))
    context["node_form"] = node_form
    return render(request, TEMPLATE, context, status=400)


@require_POST
@login_required
def wizard_node_confirm(request: HttpRequest, draft_id: str) -> HttpResponse:
    """Trust the pending node once its fingerprint is confirmed; choose it for the pool."""
    draft = the_draft(request, draft_id)
    require_staff(request, "change nodes")
    node = Node.objects.filter(name=draft["pending_node"], trust=NodeTrust.PENDING).first()
    if node is None:
        return redirect(step_url(draft_id, "nodes"))
    try:
        node = node_services.confirm_node(node, request.POST.get("fingerprint", ""))
    except node_services.NodeError as refusal:
        messages.error(request, str(refusal))
    else:
        draft["pending_node"] = ""
        draft["nodes"] = [*draft["nodes"], node.pk]
        wizard.save_draft(request.session, draft_id, draft)
        messages.success(request, f"Node {node.name} is trusted and chosen for the pool.")
    return redirect(step_url(draft_id, "nodes"))


# -- the targets step: add and remove draft targets --------------------------------------------


@require_POST
@login_required
def wizard_target_add(request: HttpRequest, draft_id: str) -> HttpResponse:
    """Add a target to the draft; its capacity is prefilled from its runtime where it says."""
    draft = the_draft(request, draft_id)
    form = target_form(draft, request.POST)
    if form.is_valid():
        data = form.cleaned_data
        detected, source = None, ""
        if data["source"] == wizard.Source.RUNTIME:
            # What Add target does: a provider's host is never asked about paths it lacks, and a
            # node's agent answers for several runtimes (docs/pools-console.md).
            detected, source = validation.detect_runtime_concurrency(data["base_url"])
        capacity = detected or DraftTargetForm.DEFAULT_CAPACITY
        said = f"Prefilled from {source}." if detected else UNDETECTED[data["source"]]
        draft["targets"].append(wizard.draft_target(data, capacity=capacity, capacity_source=said))
        draft["identity_confirmed"] = False  # confirmed for other targets, if at all
        wizard.save_draft(request.session, draft_id, draft)
        return redirect(step_url(draft_id, "targets"))
    context = step_context(request, draft_id, draft, "targets", None)
    context["target_form"] = form
    return render(request, TEMPLATE, context, status=400)


@require_POST
@login_required
def wizard_target_remove(request: HttpRequest, draft_id: str, index: int) -> HttpResponse:
    """Remove a target from the draft."""
    draft = the_draft(request, draft_id)
    if 0 <= index < len(draft["targets"]):
        draft["targets"].pop(index)
        draft["identity_confirmed"] = False
        wizard.save_draft(request.session, draft_id, draft)
    return redirect(step_url(draft_id, "targets"))


# -- the check step: Validate and Dry run on the draft ------------------------------------------


@require_GET
@login_required
def wizard_validate(request: HtmxHttpRequest, draft_id: str) -> HttpResponse:
    """Validate the draft as the pool would be created (it calls every target): the report's
    partial, which the check step loads; without JavaScript, the step with its report."""
    draft = the_draft(request, draft_id)
    form = ValidateForm(request.GET or None)
    report = None
    if form.is_valid() and draft["targets"]:
        report = wizard.validate(draft, probe_kinds=form.cleaned_data["probe_kinds"])
    if request.htmx:
        return render(request, REPORT, {"report": report})
    return check_page(request, draft_id, draft, report=report, validate_form=form)


@require_GET
@login_required
def wizard_dry_run(request: HtmxHttpRequest, draft_id: str) -> HttpResponse:
    """Rank the draft's targets as its strategy would now; route nothing, keep nothing. The
    result's partial for htmx; without JavaScript, the step with its result."""
    draft = the_draft(request, draft_id)
    form = DryRunForm(request.GET or None)
    ranking = None
    error = ""
    if form.is_valid() and draft["targets"]:
        asked = form.cleaned_data
        headers = {"x-nexus-session-id": asked["session_id"]} if asked["session_id"] else {}
        try:
            ranking = wizard.dry_run(draft, kind=asked["kind"], headers=headers)
        except IntegrityError:
            error = "The slug was taken meanwhile: go back to Name and slug."
    if request.htmx:
        return render(request, DRY_RUN_RESULT, {"ranking": ranking, "error": error})
    return check_page(request, draft_id, draft, ranking=ranking, error=error, dry_run_form=form)


def check_page(
    request: HttpRequest, draft_id: str, draft: dict[str, Any], **shown: Any
) -> HttpResponse:
    """Render the check step with a report or a ranking asked for without JavaScript."""
    response = render(
        request,
        TEMPLATE,
        {**step_context(request, draft_id, draft, "check", step_form(request, draft, "check")),
         **shown},
    )  # fmt: skip
    patch_vary_headers(response, ["HX-Request"])
    return response


# -- the summary and Create ----------------------------------------------------------------------


def summary(draft: dict[str, Any]) -> dict[str, Any]:
    """Return what the summary lists: every choice, each key only as "set"."""
    pool, _ = wizard.build(draft)
    return {
        "nodes": chosen_nodes(draft),
        "problems": wizard.identity_problems(draft),
        "strategy": pool.get_strategy_display(),
    }


def blocking(request: HttpRequest, draft: dict[str, Any]) -> list[tuple[str, str]]:
    """Return (step, why) for each thing that keeps the draft from being created."""
    found = []
    whole = PoolCreateForm(
        {**draft["pool"], "compatibility_mode": draft["compatibility_mode"],
         "strategy": draft["strategy"]},
        user=request.user,
    )  # fmt: skip
    if not whole.is_valid():
        for name, errors in whole.errors.items():
            label = whole.fields[name].label if name in whole.fields else "Pool"
            found.append(("name", f"{label}: {' '.join(str(error) for error in errors)}"))
    if not draft["targets"]:
        found.append(("targets", step_problem(draft, "targets")))
    if refusal := wizard.mode_refusal(draft):
        found.append(("targets", refusal))
    if wizard.identity_problems(draft) and not draft["identity_confirmed"]:
        found.append(("check", "Exact replicas whose identity cannot be proven: confirm it."))
    return found


def create(request: HttpRequest, draft_id: str, draft: dict[str, Any]) -> HttpResponse:
    """Create the pool the draft describes, or show the summary with what keeps it from being."""
    if blocking(request, draft):
        context = step_context(request, draft_id, draft, "summary", None)
        context["problem"] = "Not created yet: see what is missing above."
        return render(request, TEMPLATE, context, status=400)
    try:
        pool = wizard.save(draft, request.user)
    except IntegrityError:
        messages.error(request, "Not created: the slug was taken meanwhile.")
        return redirect(step_url(draft_id, "name"))
    wizard.drop_draft(request.session, draft_id)
    count = len(draft["targets"])
    messages.success(request, f"{pool.name} created with {count} target{'s' if count > 1 else ''}.")
    return redirect("pools:created", pool.slug)


@require_GET
@login_required
def pool_created(request: HttpRequest, slug: str) -> HttpResponse:
    """Show the new pool's model name, with curl and `openai` snippets and a token picker."""
    pool = seen_pool(request.user, slug)
    return render(request, CREATED, {"pool": pool, "tokens": calling_tokens(request, pool)})
