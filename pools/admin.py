"""Django admin for pools, targets and routing history; target credentials are write-only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from pools import services
from pools.models import Pool, RequestKind, RoutingRecord, Target, node_base_url


class TargetAdminForm(forms.ModelForm):
    # A URL typed without a scheme gets https: never send a provider key in clear by accident.
    base_url = forms.URLField(
        max_length=500,
        required=False,
        assume_scheme="https",
        help_text=Target._meta.get_field("base_url").help_text,
    )
    kinds = forms.MultipleChoiceField(
        choices=RequestKind.choices, widget=forms.CheckboxSelectMultiple
    )
    credential = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: the stored key is never shown. Leave blank to keep it.",
    )
    remove_credential = forms.BooleanField(required=False, label="Remove stored credential")

    class Meta:
        model = Target
        fields = [
            "pool",
            "name",
            "node",
            "base_url",
            "model_id",
            "priority",
            "capacity_weight",
            "kinds",
            "enabled",
            "position",
        ]

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        node = cleaned.get("node")
        if node is not None:
            # A node target is reached through the node's agent, whatever was typed.
            cleaned["base_url"] = node_base_url(node.address)
        elif not cleaned.get("base_url"):
            self.add_error("base_url", "Give a base URL, or choose a node.")
        return cleaned

    def save(self, commit: bool = True) -> Target:
        if self.cleaned_data.get("remove_credential"):
            self.instance.set_credential("")
        elif self.cleaned_data.get("credential"):
            self.instance.set_credential(self.cleaned_data["credential"])
        return super().save(commit)


class TargetInline(admin.TabularInline):
    model = Target
    form = TargetAdminForm
    extra = 0


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "model_name",
        "strategy",
        "compatibility_mode",
        "target_count",
        "updated_at",
    ]
    list_filter = ["strategy", "compatibility_mode", "continuity_enabled"]
    search_fields = ["name", "slug", "description"]
    inlines = [TargetInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Pool]:
        return super().get_queryset(request).annotate(target_count=Count("targets"))

    def get_readonly_fields(self, request: HttpRequest, obj: Pool | None = None) -> list[str]:
        return [] if obj is None else ["slug"]

    def get_prepopulated_fields(
        self, request: HttpRequest, obj: Pool | None = None
    ) -> dict[str, Sequence[str]]:
        return {"slug": ("name",)} if obj is None else {}

    @admin.display(description="Model name", ordering="slug")
    def model_name(self, pool: Pool) -> str:
        return pool.model_name

    @admin.display(description="Targets", ordering="target_count")
    def target_count(self, pool: Any) -> int:
        return pool.target_count


@admin.register(Target)
class TargetAdmin(admin.ModelAdmin):
    form = TargetAdminForm
    list_display = [
        "name",
        "pool",
        "node",
        "base_url",
        "model_id",
        "priority",
        "capacity_weight",
        "enabled",
        "state",
        "credential_stored",
    ]
    list_filter = ["enabled", "state", "priority", "pool", "node"]
    search_fields = ["name", "model_id", "base_url", "pool__slug", "pool__name"]
    list_select_related = ["pool", "node"]
    readonly_fields = ["state", "state_changed_at"]
    actions = ["drain", "resume"]

    @admin.action(description="Drain selected targets")
    def drain(self, request: HttpRequest, targets: QuerySet[Target]) -> None:
        for target in targets:
            services.drain_target(target)
        self.message_user(request, f"Draining {len(targets)} target(s).", messages.SUCCESS)

    @admin.action(description="Resume selected targets")
    def resume(self, request: HttpRequest, targets: QuerySet[Target]) -> None:
        for target in targets:
            try:
                services.resume_target(target)
            except services.CannotResume as refusal:
                self.message_user(request, str(refusal), messages.ERROR)
            else:
                self.message_user(request, f"{target.name} resumed.", messages.SUCCESS)

    @admin.display(description="Credential", boolean=True)
    def credential_stored(self, target: Target) -> bool:
        return target.has_credential


@admin.register(RoutingRecord)
class RoutingRecordAdmin(admin.ModelAdmin):
    """Routing history, read-only: the gateway writes it and retention prunes it."""

    list_display = [
        "created_at",
        "request_id",
        "pool",
        "kind",
        "target_name",
        "outcome",
        "status_code",
        "total_ms",
        "token_name",
    ]
    list_filter = ["outcome", "kind", "stream", "pool"]
    search_fields = ["request_id", "target_name", "token_name"]
    list_select_related = ["pool"]
    # The history can hold millions of rows: no full count on every page.
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: RoutingRecord | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: RoutingRecord | None = None) -> bool:
        return False
