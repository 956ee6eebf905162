"""Django admin for model folders (adding or deleting one makes or removes its directory),
resource groups and presets, and services with their revisions and routes (read-only: the
services layer and the reconciler write them)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.defaultfilters import filesizeformat, pluralize

from nexus.auth import acting_user
from serving import folders, services
from serving.launch import LaunchError
from serving.models import (
    AutoScalingRule,
    ModelFolder,
    ResourceGroup,
    ResourcePreset,
    Revision,
    Route,
    ScaleEvent,
    Service,
    ServiceLifecycle,
)


class ModelFolderAdminForm(forms.ModelForm):
    class Meta:
        model = ModelFolder
        fields = ["name", "owner", "project", "description"]

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if self.instance.pk is None:
            try:
                folders.check_name_free(name)
            except folders.FolderExists as taken:
                raise forms.ValidationError(str(taken)) from None
        return name


@admin.register(ModelFolder)
class ModelFolderAdmin(admin.ModelAdmin):
    form = ModelFolderAdminForm
    list_display = ["name", "project", "usage", "owner", "created_at"]
    list_filter = ["project", "usage"]
    search_fields = ["name", "description"]
    readonly_fields = ["usage", "directory", "created_at", "updated_at"]

    @admin.display(description="Directory")
    def directory(self, folder: ModelFolder) -> str:
        return str(folder.path) if folder.pk else "—"

    def get_readonly_fields(self, request: HttpRequest, obj: ModelFolder | None = None) -> Any:
        # The name is the directory's name: renaming the row would lose the files.
        fields = super().get_readonly_fields(request, obj)
        return [*fields, "name"] if obj is not None else fields

    def save_model(
        self, request: HttpRequest, obj: ModelFolder, form: forms.ModelForm, change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
        else:
            obj.owner = obj.owner or acting_user(request)
            folders.create_folder(obj)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # The admin's own "cannot delete, protected" page names the services using a folder.
        deleted, counts, permissions, protected = super().get_deleted_objects(objs, request)
        in_use = [reason for folder in objs if (reason := folders.in_use_reason(folder))]
        return deleted, counts, permissions, [*protected, *in_use]

    def delete_model(self, request: HttpRequest, obj: ModelFolder) -> None:
        folders.delete_folder(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ModelFolder]) -> None:
        for folder in queryset:
            folders.delete_folder(folder)


@admin.register(ResourceGroup)
class ResourceGroupAdmin(admin.ModelAdmin):
    list_display = ["name", "all_nodes", "node_count", "created_at"]
    search_fields = ["name", "description"]
    filter_horizontal = ["nodes"]

    @admin.display(description="Nodes")
    def node_count(self, group: ResourceGroup) -> str:
        return "every trusted node" if group.all_nodes else str(group.nodes.count())


@admin.register(ResourcePreset)
class ResourcePresetAdmin(admin.ModelAdmin):
    list_display = ["name", "cpu", "memory", "cuda_shares"]
    search_fields = ["name"]

    @admin.display(description="Memory", ordering="memory_bytes")
    def memory(self, preset: ResourcePreset) -> str:
        return filesizeformat(preset.memory_bytes)


class ReadOnlyInline(admin.TabularInline):
    """A history shown in its service's page; rows change only through the services layer."""

    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RevisionInline(ReadOnlyInline):
    model = Revision
    fields = readonly_fields = (
        "number",
        "state",
        "runtime_variant",
        "model_folder",
        "failure_reason",
        "created_at",
    )


class RouteInline(ReadOnlyInline):
    model = Route
    fields = readonly_fields = (
        "revision",
        "node",
        "state",
        "probe_result",
        "port",
        "status_message",
        "created_at",
    )


@admin.register(Service)
class ServiceAdmin(admin.ModelAdmin):
    """Services are declared through the launcher or the API, where every setting is checked."""

    list_display = ["name", "lifecycle", "status", "desired_replicas", "open_to_public", "owner"]
    list_filter = ["lifecycle", "open_to_public", "project"]
    search_fields = ["name"]
    inlines = [RevisionInline, RouteInline]
    actions = ["destroy"]
    readonly_fields = [
        "name",
        "project",
        "owner",
        "lifecycle",
        "latest_revision",
        "running_revision",
        "pool",
        "status_message",
        "created_at",
        "updated_at",
        "destroyed_at",
    ]
    fields = [*readonly_fields[:4], "desired_replicas", "open_to_public", *readonly_fields[4:]]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Service]:
        return services.with_ready_counts(super().get_queryset(request)).select_related("owner")

    @admin.display(description="Status")
    def status(self, service: Service) -> str:
        return services.status_text(service)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Service | None = None) -> bool:
        # Deleting the row would orphan its replicas on the nodes; destroy it instead.
        return False

    def save_model(
        self, request: HttpRequest, obj: Service, form: forms.ModelForm, change: bool
    ) -> None:
        # Through the services layer: checked bounds, and the gateway told about access.
        stored = Service.objects.get(pk=obj.pk)
        try:
            services.update_service(
                stored,
                desired_replicas=obj.desired_replicas,
                open_to_public=obj.open_to_public,
            )
        except LaunchError as refused:
            self.message_user(request, str(refused), messages.ERROR)

    @admin.action(description="Destroy the selected services")
    def destroy(self, request: HttpRequest, queryset: QuerySet[Service]) -> None:
        for service in queryset:
            if service.lifecycle == ServiceLifecycle.ACTIVE:
                services.delete_service(service)
        self.message_user(request, "Destroying: the replicas are drained and stopped.")


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written by the services layer and the reconciler only."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Revision)
class RevisionAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "state", "runtime_variant", "model_folder", "created_at"]
    list_filter = ["state", "runtime_variant"]
    search_fields = ["service__name"]
    list_select_related = ["service", "model_folder"]


@admin.register(Route)
class RouteAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "revision", "node", "state", "probe_result", "error_count"]
    list_filter = ["state", "probe_result"]
    search_fields = ["service__name", "process_id"]
    list_select_related = ["service", "revision__service", "node"]
    actions = ["clear_errors"]

    @admin.display(description="Errors")
    def error_count(self, route: Route) -> int:
        return len(route.errors)

    @admin.action(description="Clear errors and retry")
    def clear_errors(self, request: HttpRequest, queryset: QuerySet[Route]) -> None:
        for route in queryset:
            services.clear_route_errors(route)
        count = len(queryset)
        self.message_user(
            request, f"Cleared the errors of {count} route{pluralize(count)}; retrying."
        )


@admin.register(AutoScalingRule)
class AutoScalingRuleAdmin(admin.ModelAdmin):
    list_display = ["__str__", "metric_source", "condition", "step_size", "cooldown_s"]
    list_display += ["min_replicas", "max_replicas", "created_at", "last_triggered_at"]
    list_filter = ["metric_source", "condition"]
    search_fields = ["service__name", "metric_name"]
    list_select_related = ["service"]
    readonly_fields = ["created_at", "last_triggered_at"]


@admin.register(ScaleEvent)
class ScaleEventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "service", "rule_text", "value", "outcome"]
    list_display += ["replicas_before", "replicas_after"]
    list_filter = ["outcome", "metric_source"]
    search_fields = ["service__name", "reason"]
    list_select_related = ["service"]
