"""The Smart Balancer pages' forms: a token (kind, reach, expiry, limits); a pool's settings, a
target added, a target's inline edit."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from django import forms
from django.utils import timezone

from nexus import access, scopes
from nexus.models import DEFAULT_PROJECT, LIMIT_FIELDS, Project, default_project_pk
from nodes.models import Node, NodeModel, NodeTrust
from pools import services, traffic, validation, wizard
from pools.models import (
    CompatibilityMode,
    Pool,
    RequestKind,
    Strategy,
    Target,
    all_request_kinds,
    node_base_url,
    node_model_problem,
)


class TokenIssueForm(forms.Form):
    """Ask for what ApiToken.issue takes, with the API's rules: the issuer changes the token's
    project, and names pools of it unless they are staff (nexus/api/serializers.py)."""

    name = forms.CharField(max_length=100, help_text="Who or what uses it, e.g. support-bot.")
    project = forms.ChoiceField(help_text="Whose owners and members see and revoke it.")
    kind = forms.ChoiceField(
        choices=[
            (scopes.TokenKind.CLIENT.value, "Client: calls models (/v1, /serve)"),
            (scopes.TokenKind.ADMIN.value, "Admin: automates the admin API"),
        ],
        initial=scopes.TokenKind.CLIENT.value,
    )
    access = forms.ChoiceField(
        choices=[(a.value, a.value.title()) for a in scopes.AdminAccess],
        initial=scopes.AdminAccess.READ.value,
        required=False,
        help_text="An admin token's reach: read only, or read and write.",
    )
    pools = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="The pools a client token may call; none chosen (and no service): every pool.",
    )
    services = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Model services a client token may call.",
    )
    expires_at = forms.DateTimeField(
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="In UTC; empty: it never expires.",
    )
    requests_per_minute = forms.IntegerField(
        required=False, min_value=1, help_text="Requests in any 60 s; empty for no limit."
    )
    tokens_per_minute = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Prompt and completion tokens in any 60 s; empty for no limit.",
    )
    max_concurrent = forms.IntegerField(
        label="Concurrent requests",
        required=False,
        min_value=1,
        help_text="Requests in progress at once; empty for no limit.",
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        default_project_pk()  # the default project exists from its first use on
        projects = access.changeable_projects(user).order_by("name").values_list("name", flat=True)
        project_field = self.fields["project"]
        assert isinstance(project_field, forms.ChoiceField)
        project_field.choices = [(name, name) for name in projects]
        project_field.initial = DEFAULT_PROJECT
        slugs = Pool.objects.filter(managed=False).order_by("slug").values_list("slug", flat=True)
        pools_field = self.fields["pools"]
        assert isinstance(pools_field, forms.MultipleChoiceField)
        pools_field.choices = [(slug, slug) for slug in slugs]
        services = (
            Pool.objects.filter(managed=True, service__isnull=False)
            .order_by("service__name")
            .values_list("service__name", flat=True)
        )
        services_field = self.fields["services"]
        assert isinstance(services_field, forms.MultipleChoiceField)
        services_field.choices = [(name, name) for name in services]

    def clean_expires_at(self) -> Any:
        expires_at = self.cleaned_data.get("expires_at")
        if expires_at is not None and expires_at <= timezone.now():
            raise forms.ValidationError("Choose a time in the future.")
        return expires_at

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("kind") == scopes.TokenKind.ADMIN:
            if data.get("pools") or data.get("services"):
                self.add_error("pools", "An admin token calls no pool or service.")
            if any(data.get(name) is not None for name in LIMIT_FIELDS):
                self.add_error(None, "Limits apply to client tokens: an admin token has none.")
        elif not access.is_staff(self.user) and "project" in data:
            ours = set(
                Pool.objects.filter(project__name=data["project"]).values_list("slug", flat=True)
            )
            if not data.get("pools"):
                self.add_error("pools", "Name the pools of the project that the token may call.")
            elif outside := sorted(set(data["pools"]) - ours):
                self.add_error("pools", f"Not pools of the project: {', '.join(outside)}.")
        return data

    def chosen_project(self) -> Project:
        return Project.objects.get(name=self.cleaned_data["project"])


class TargetTrafficForm(forms.ModelForm):
    """A target's inline edit on its pool's page: its tier, its capacity (and share), on or off."""

    class Meta:
        model = Target
        fields = list(services.TRAFFIC_FIELDS)


class TargetAddForm(forms.ModelForm):
    """A new target of a pool: an OpenAI-compatible endpoint with its own key (write-only)."""

    # A runtime on the local network speaks plain http more often than not.
    base_url = forms.URLField(
        label="Base URL",
        max_length=500,
        assume_scheme="http",
        help_text="OpenAI-compatible base URL, e.g. http://10.0.0.5:8000/v1.",
    )
    kinds = forms.MultipleChoiceField(
        choices=RequestKind.choices,
        widget=forms.CheckboxSelectMultiple,
        initial=all_request_kinds,
        help_text="The request kinds the endpoint serves; the others never go to it.",
    )
    credential = forms.CharField(
        label="API key",
        required=False,
        widget=forms.PasswordInput,
        help_text="Sent as its Bearer token; stored encrypted and never shown again.",
    )

    capacity_weight = forms.IntegerField(
        label="Capacity weight",
        required=False,
        min_value=1,
        help_text="Requests it runs at once, and its share within its tier. Empty: what its "
        "runtime says it runs at once (the simulator, llama.cpp, SGLang), else 4.",
    )

    DEFAULT_CAPACITY = 4

    class Meta:
        model = Target
        fields = ["name", "base_url", "model_id", "kinds", "priority", "capacity_weight"]

    def __init__(self, *args: Any, pool: Pool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool = pool

    def clean_name(self) -> str:
        name = str(self.cleaned_data["name"])
        # The form has no pool field, so the model's unique (pool, name) is not checked for it.
        if name and self.name_taken(name):
            raise forms.ValidationError(f"{self.pool.name} has a target named {name} already.")
        return name

    def name_taken(self, name: str) -> bool:
        return self.pool.targets.filter(name=name).exists()

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or self.cleaned_data
        model_id = cleaned.get("model_id")
        if model_id:
            # An Exact-replicas pool refuses a target of another model (services.add_target).
            candidate = Target(pool=self.pool, name=cleaned.get("name") or "", model_id=model_id)
            refusal = self.identity_refusal(candidate)
            if refusal:
                self.add_error("model_id", refusal)
        return cleaned

    def identity_refusal(self, candidate: Target) -> str:
        """Return why the candidate may not join the pool (Exact replicas), "" when it may."""
        return services.identity_refusal(candidate)


class PoolSettingsForm(forms.ModelForm):
    """A pool's settings on its own page; the slug stays (apps call it)."""

    class Meta:
        model = Pool
        fields = [
            "name", "description", "strategy", "max_queue", "max_queue_wait_s", "max_attempts",
            "first_byte_timeout_s", "first_token_timeout_s", "stream_idle_timeout_s",
            "max_ejection_percent", "continuity_enabled", "continuity_threshold",
            "history_retention_days", "history_max_rows",
        ]  # fmt: skip
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}
        labels = {
            "max_queue": "Queue length",
            "max_queue_wait_s": "Longest queue wait (s)",
            "max_attempts": "Attempts",
            "first_byte_timeout_s": "First byte timeout (s)",
            "first_token_timeout_s": "First token timeout (s)",
            "stream_idle_timeout_s": "Stream idle timeout (s)",
            "max_ejection_percent": "Ejection cap (%)",
            "continuity_enabled": "Continuity",
            "history_retention_days": "History kept (days)",
            "history_max_rows": "History rows at most",
        }


class DryRunForm(forms.Form):
    """A sample request for a dry run: its kind, and a conversation it may continue."""

    kind = forms.ChoiceField(choices=RequestKind.choices, initial=RequestKind.CHAT)
    session_id = forms.CharField(
        label="Session id",
        required=False,
        max_length=200,
        help_text="As X-Nexus-Session-Id: shows where the conversation would stay.",
    )


class ValidateForm(forms.Form):
    """Run Validate; the one-token probe of each kind only when asked (real inference calls)."""

    run = forms.CharField(widget=forms.HiddenInput, initial="1")
    probe_kinds = forms.BooleanField(
        label="Also send one one-token request per kind",
        required=False,
        help_text="Real inference calls to each target (a provider bills them).",
    )


class TryTrafficForm(forms.Form):
    """Real requests through the pool's gateway, bounded (pools.traffic)."""

    requests = forms.IntegerField(
        min_value=1, max_value=traffic.MAX_REQUESTS, initial=40,
        help_text=f"At most {traffic.MAX_REQUESTS}.",
    )  # fmt: skip
    concurrency = forms.IntegerField(
        min_value=1, max_value=traffic.MAX_CONCURRENCY, initial=4,
        help_text=f"Requests at once, at most {traffic.MAX_CONCURRENCY}.",
    )  # fmt: skip
    kind = forms.ChoiceField(choices=RequestKind.choices, initial=RequestKind.CHAT)
    stream = forms.BooleanField(required=False, initial=True, label="Stream the answers")
    max_tokens = forms.IntegerField(
        min_value=1, max_value=traffic.MAX_TOKENS, initial=16, label="Max tokens",
        help_text=f"Per answer, at most {traffic.MAX_TOKENS}.",
    )  # fmt: skip


class DrillForm(TryTrafficForm):
    """A failure drill: the target to drain, and the burst each phase sends."""

    target = forms.ChoiceField(help_text="Drained in the middle phase, resumed for the last.")

    field_order = ["target", "requests", "concurrency", "kind", "stream", "max_tokens"]

    def __init__(self, *args: Any, pool: Pool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        target_field = self.fields["target"]
        assert isinstance(target_field, forms.ChoiceField)
        target_field.choices = [
            (str(pk), name)
            for pk, name in pool.targets.filter(state="active", enabled=True).values_list(
                "pk", "name"
            )
        ]
        requests_field = self.fields["requests"]
        requests_field.label = "Requests per phase"


# The document's caveats of each compatibility mode, shown beside the choice.
COMPATIBILITY_CAVEATS = {
    CompatibilityMode.EXACT_REPLICAS: "Exact replicas: every target serves the very same model "
    "(same weights, same build), so any answer may come from any of them; Validate asks you to "
    "confirm it where it cannot prove it.",
    CompatibilityMode.EQUIVALENT_GENERATION: "Equivalent generation: targets serve comparable "
    "models (e.g. one family on different runtimes or providers); answers may differ between "
    "them, and Validate warns of differing context lengths and kinds.",
}
COMPATIBILITY_HELP = " ".join(COMPATIBILITY_CAVEATS.values())

# One line per strategy, Smart first and recommended.
STRATEGY_LINES = {
    Strategy.SMART: "Smart (recommended): the shortest expected wait, with continuity as a bonus.",
    Strategy.PRIORITY: "Priority: the least busy of the first tier.",
    Strategy.CAPACITY: "Capacity: shares by weight.",
    Strategy.LEAST_BUSY: "Least busy: the lowest load.",
    Strategy.ROUND_ROBIN: "Round robin: in turn.",
}
STRATEGY_HELP = " ".join(STRATEGY_LINES.values())


class PoolCreateForm(forms.ModelForm):
    """A new pool: its name, its slug (fixed once created), project, compatibility, strategy."""

    project = forms.ChoiceField(help_text="Whose members manage the pool and see it.")

    class Meta:
        model = Pool
        fields = ["name", "slug", "project", "compatibility_mode", "strategy", "description"]
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}
        help_texts = {
            "slug": "Apps call the pool as @pool/<slug>; fixed once created.",
            "compatibility_mode": COMPATIBILITY_HELP,
            "strategy": STRATEGY_HELP,
        }

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        default_project_pk()  # the default project exists from its first use on
        names = access.changeable_projects(user).order_by("name").values_list("name", flat=True)
        project_field = self.fields["project"]
        assert isinstance(project_field, forms.ChoiceField)
        project_field.choices = [(name, name) for name in names]
        project_field.initial = DEFAULT_PROJECT

    def clean_project(self) -> Project:
        return Project.objects.get(name=self.cleaned_data["project"])


# -- the create-pool wizard's steps (pools.wizard_views) ---------------------------------------


class PoolNameForm(PoolCreateForm):
    """The wizard's name step: the name, the slug (checked as it is typed), project, description."""

    class Meta(PoolCreateForm.Meta):
        fields = ["name", "slug", "project", "description"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Rendered with its as-you-type check in its field group, under its help. Field's
        # template_name (Django 5.0) is not in django-stubs yet.
        slug = self.fields["slug"]
        slug.template_name = "pools/wizard_slug_field.html"  # type: ignore[attr-defined]


class CompatibilityForm(forms.Form):
    """The wizard's compatibility step: one mode, each with the document's caveat."""

    compatibility_mode = forms.ChoiceField(
        label="Compatibility mode",
        choices=[(mode.value, caveat) for mode, caveat in COMPATIBILITY_CAVEATS.items()],
        widget=forms.RadioSelect,
    )


class StrategyForm(forms.Form):
    """The wizard's strategy step: one line each, Smart recommended."""

    strategy = forms.ChoiceField(
        label="Strategy",
        choices=[(strategy.value, line) for strategy, line in STRATEGY_LINES.items()],
        widget=forms.RadioSelect,
    )


class NodeChoiceField(forms.ModelMultipleChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        assert isinstance(obj, Node)
        return f"{obj.name} · {obj.get_status_display().lower()} · {obj.address}"


class NodesForm(forms.Form):
    """The wizard's nodes step: the trusted nodes whose models may become targets."""

    nodes = NodeChoiceField(
        queryset=Node.objects.filter(trust=NodeTrust.TRUSTED),
        widget=forms.CheckboxSelectMultiple,
        required=False,
        label="Trusted nodes",
        help_text="Their models are offered as targets next; none chosen: runtime URLs and "
        "provider endpoints only.",
    )


SOURCES = [
    ("node", "A model on a chosen node"),
    ("runtime", "A runtime URL"),
    ("provider", "A provider endpoint, with its own key"),
]


class DraftTargetForm(TargetAddForm):
    """A target of a pool not created yet: a chosen node's model, a runtime URL or a provider
    endpoint with its own key. Priority and capacity come on a later step."""

    source = forms.ChoiceField(
        choices=SOURCES,
        widget=forms.RadioSelect,
        label="Where it runs",
        help_text="A node's model needs only the model; a runtime URL its base URL and model "
        "id; a provider endpoint its key too.",
    )
    node_model = forms.ChoiceField(
        required=False,
        label="Model on a node",
        help_text="From the chosen nodes' inventories, as their agents last reported them.",
    )
    capacity_weight = None  # type: ignore[assignment]

    field_order = ["source", "node_model", "name", "base_url", "model_id", "credential", "kinds"]

    class Meta(TargetAddForm.Meta):
        fields = ["name", "base_url", "model_id", "kinds"]

    def __init__(
        self,
        *args: Any,
        pool: Pool,
        nodes: Sequence[Node],
        taken: Sequence[str],
        replicas_of: Sequence[Target] = (),
        **kwargs: Any,
    ) -> None:
        """`replicas_of`: an Exact-replicas draft's targets, whose model a new one must serve."""
        super().__init__(*args, pool=pool, **kwargs)
        self.nodes = {node.pk: node for node in nodes}
        self.taken = list(taken)
        self.replicas_of = list(replicas_of)
        models = NodeModel.objects.filter(node__in=nodes).select_related("node")
        node_model = self.fields["node_model"]
        assert isinstance(node_model, forms.ChoiceField)
        node_model.choices = [("", "—")] + [
            (f"{m.node_id}:{m.model_id}", f"{m.model_id} on {m.node.name} ({m.runtime or '?'})")
            for m in models
        ]
        source = self.fields["source"]
        source.initial = "node" if models else "runtime"
        for name in ("name", "base_url", "model_id"):
            self.fields[name].required = False
        self.fields["name"].help_text = "Empty: the node's name, or the URL's host."
        base_url = self.fields["base_url"]
        base_url.help_text = "A runtime's or provider's base URL, e.g. http://10.0.0.5:8000/v1."
        self.fields["credential"].help_text = (
            "A provider's key (a runtime's, if it asks for one). Kept encrypted on the server "
            "until the pool is created, then stored with the target; never shown again."
        )

    def name_taken(self, name: str) -> bool:
        return name in self.taken

    def identity_refusal(self, candidate: Target) -> str:
        # Judged at the end of clean(), once a node's model has made the model id.
        return ""

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        source = data.get("source")
        node = None
        if source == "node":
            chosen = data.get("node_model") or ""
            node_pk, _, model_id = chosen.partition(":")
            node = self.nodes.get(int(node_pk)) if node_pk.isdecimal() else None
            if node is None:
                self.add_error("node_model", "Choose a model of one of the chosen nodes.")
                return data
            if problem := node_model_problem(node, model_id):
                self.add_error("node_model", problem)
                return data
            if data.get("credential"):
                self.add_error("credential", "A target on a node uses the node's credential.")
            data.update(model_id=model_id, base_url=node_base_url(node.address))
        elif source in ("runtime", "provider"):
            if not data.get("base_url") and "base_url" not in self.errors:
                self.add_error("base_url", "Give the endpoint's base URL.")
            if not data.get("model_id"):
                self.add_error("model_id", "Give the model name the endpoint serves.")
            if source == "provider" and not data.get("credential"):
                self.add_error("credential", "A provider endpoint needs its key.")
        data["node"] = node
        if source and not data.get("name") and "name" not in self.errors:
            data["name"] = wizard.derived_name(source, node, data.get("base_url", ""), self.taken)
        if self.replicas_of and data.get("model_id") and not self.errors:
            # The save-time rule of services.add_target, against the draft's targets.
            candidate = Target(name=data.get("name", ""), model_id=data["model_id"], node=node)
            refusal = validation.identity_refusal(
                validation.identity_of(candidate),
                [validation.identity_of(target) for target in self.replicas_of],
            )
            if refusal:
                self.add_error("node_model" if source == "node" else "model_id", refusal)
        return data


class WeightsForm(forms.Form):
    """The wizard's priority and capacity step: both per target, as the model bounds them."""

    def __init__(self, *args: Any, targets: Sequence[Mapping[str, Any]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        base = forms.fields_for_model(Target, fields=["priority", "capacity_weight"])
        self.rows = []
        for index, entry in enumerate(targets):
            priority = copy.deepcopy(base["priority"])
            priority.label = f"Priority of {entry['name']}"
            priority.initial = entry["priority"]
            priority.help_text = ""
            capacity = copy.deepcopy(base["capacity_weight"])
            capacity.label = f"Capacity weight of {entry['name']}"
            capacity.initial = entry["capacity_weight"]
            capacity.help_text = entry.get("capacity_source", "")
            # Shown in a table, without their labels: the inputs carry them.
            for field in (priority, capacity):
                field.widget.attrs.update({"aria-label": field.label, "class": "short"})
            self.fields[f"priority_{index}"] = priority
            self.fields[f"capacity_{index}"] = capacity
            self.rows.append((entry, self[f"priority_{index}"], self[f"capacity_{index}"]))

    def values(self) -> list[tuple[int, int]]:
        """Return each target's (priority, capacity weight), in the draft's order."""
        data = self.cleaned_data
        return [(data[f"priority_{i}"], data[f"capacity_{i}"]) for i in range(len(self.rows))]


class IdentityConfirmForm(forms.Form):
    """The wizard's check step: the operator's word that an Exact-replicas draft's targets
    serve one model, where Validate cannot prove it."""

    confirm_identity = forms.BooleanField(required=False)

    def __init__(self, *args: Any, problems: Sequence[str], count: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.problems = list(problems)
        self.fields["confirm_identity"].label = (
            f"I confirm these {count} targets serve one model: I manage the copies and know "
            "they are interchangeable."
        )

    def clean_confirm_identity(self) -> bool:
        confirmed = bool(self.cleaned_data.get("confirm_identity"))
        if self.problems and not confirmed:
            raise forms.ValidationError(
                "Identity cannot be proven: confirm it, or go back and choose Equivalent "
                "generation."
            )
        return confirmed
