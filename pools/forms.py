"""The Smart Balancer pages' forms: a token (kind, reach, expiry, limits); a pool's settings, a
target added, a target's inline edit."""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils import timezone

from nexus import access, scopes
from nexus.models import DEFAULT_PROJECT, LIMIT_FIELDS, Project, default_project_pk
from pools import services, traffic
from pools.models import Pool, RequestKind, Target, all_request_kinds


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
        if self.pool.targets.filter(name=name).exists():
            raise forms.ValidationError(f"{self.pool.name} has a target named {name} already.")
        return name


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
COMPATIBILITY_HELP = (
    "Exact replicas: every target serves the very same model (same weights, same build), so any "
    "answer may come from any of them; Validate asks you to confirm it where it cannot prove it. "
    "Equivalent generation: targets serve comparable models (e.g. one family on different "
    "runtimes or providers); answers may differ between them, and Validate warns of differing "
    "context lengths and kinds."
)


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
            "strategy": "Smart (recommended): the shortest expected wait, with continuity as a "
            "bonus. Priority: the least busy of the first tier. Capacity: shares by weight. "
            "Least busy: the lowest load. Round robin: in turn.",
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
