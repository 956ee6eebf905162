"""Django admin for deployments; node rows are read-only (the Celery task writes them)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from deployments.models import Deployment, DeploymentNode

PROGRESS_FIELDS = [
    "node",
    "state",
    "phase",
    "bytes_done",
    "bytes_total",
    "percent",
    "message",
    "error",
    "log",
    "agent_job_id",
    "attempt",
    "started_at",
    "finished_at",
    "updated_at",
]


class DeploymentNodeInline(admin.TabularInline):
    model = DeploymentNode
    fields = readonly_fields = (
        "node",
        "state",
        "phase",
        "percent",
        "message",
        "error",
        "attempt",
        "finished_at",
    )
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Deployment | None = None) -> bool:
        # Rows are made with their deployment, whose nodes are checked; see the Deployments page.
        return False


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "runtime", "model_source", "model_name", "state", "created_at"]
    list_filter = ["runtime", "model_source"]
    search_fields = ["name", "model_name", "model_location"]
    readonly_fields = ["created_by", "created_at"]
    inlines = [DeploymentNodeInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Deployment]:
        return super().get_queryset(request).prefetch_related("nodes")

    @admin.display(description="State")
    def state(self, deployment: Deployment) -> str:
        return deployment.get_state_display()

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Starting one needs its nodes checked and its jobs queued: the page and the API do that.
        return False


@admin.register(DeploymentNode)
class DeploymentNodeAdmin(admin.ModelAdmin):
    list_display = ["deployment", "node", "state", "phase", "percent", "attempt", "updated_at"]
    list_filter = ["state", "phase"]
    search_fields = ["deployment__name", "node__name", "error"]
    readonly_fields = ["deployment", *PROGRESS_FIELDS]
    list_select_related = ["deployment", "node"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
