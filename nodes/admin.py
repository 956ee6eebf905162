"""Django admin for nodes and their inventory; the node credential is write-only."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from nodes import services
from nodes.models import Node, NodeModel


class NodeAdminForm(forms.ModelForm):
    """Rename a node or change where and how its agent is reached; the agent is proven again."""

    # Agents serve plain HTTP on the operator's network (docs/nodes.md), so that is the default.
    address = forms.URLField(
        max_length=500, assume_scheme="http", help_text=Node._meta.get_field("address").help_text
    )
    credential = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: the stored credential is never shown. Leave blank to keep it.",
    )

    class Meta:
        model = Node
        fields = ["name", "address"]

    identity: services.Identity | None = None

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        address, credential = cleaned.get("address"), cleaned.get("credential")
        if address is None or not ("address" in self.changed_data or credential):
            return cleaned
        stored = Node.objects.get(pk=self.instance.pk)
        try:
            self.identity = services.prove_identity(
                address, credential or stored.get_credential(), node=stored
            )
        except services.NodeError as error:
            raise forms.ValidationError(str(error)) from None
        return cleaned


class NodeModelInline(admin.TabularInline):
    model = NodeModel
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "model_id",
        "runtime",
        "state",
        "source",
        "digest",
        "process_id",
        "seen_at",
    )

    def has_add_permission(self, request: HttpRequest, obj: Node | None = None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    """Nodes; adding one here skips the identity check, so prefer the Nodes page or the API."""

    form = NodeAdminForm
    list_display = [
        "name",
        "address",
        "trust",
        "status",
        "last_seen_at",
        "hostname",
        "model_count",
        "credential_stored",
    ]
    list_filter = ["trust", "status"]
    search_fields = ["name", "address", "hostname", "fingerprint"]
    readonly_fields = [
        "fingerprint",
        "public_key",
        "trust",
        "trusted_at",
        "status",
        "status_changed_at",
        "last_seen_at",
        "last_error",
        "hostname",
        "agent_version",
        "resources",
        "free",
        "metrics",
        "created_at",
        "updated_at",
    ]
    inlines = [NodeModelInline]
    actions = ["refresh", "reject"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Adding proves the agent's identity and shows its fingerprint: the Nodes page does that.
        return False

    def save_model(
        self, request: HttpRequest, obj: Node, form: NodeAdminForm, change: bool
    ) -> None:
        # Through the service, which bumps the configuration and re-checks trust on a move.
        data = form.cleaned_data
        services.update_node(
            Node.objects.get(pk=obj.pk),
            name=data["name"],
            address=data["address"],
            credential=data.get("credential") or None,
            identity=form.identity,
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return super().get_queryset(request).annotate(model_count=Count("models"))

    @admin.display(description="Models", ordering="model_count")
    def model_count(self, node: Node) -> int:
        return node.model_count  # type: ignore[attr-defined]

    @admin.display(description="Credential", boolean=True)
    def credential_stored(self, node: Node) -> bool:
        return node.has_credential

    @admin.action(description="Refresh selected nodes now")
    def refresh(self, request: HttpRequest, nodes: QuerySet[Node]) -> None:
        for node in nodes:
            services.refresh_node(node)
        self.message_user(request, f"Refreshed {len(nodes)} node(s).", messages.SUCCESS)

    @admin.action(description="Reject selected nodes")
    def reject(self, request: HttpRequest, nodes: QuerySet[Node]) -> None:
        for node in nodes:
            services.reject_node(node)
        self.message_user(request, f"Rejected {len(nodes)} node(s).", messages.SUCCESS)


@admin.register(NodeModel)
class NodeModelAdmin(admin.ModelAdmin):
    """The fleet's inventory, read-only: refreshes write it."""

    list_display = ["model_id", "node", "runtime", "state", "source", "digest", "seen_at"]
    list_filter = ["state", "source", "runtime", "node"]
    search_fields = ["model_id", "node__name", "digest"]
    list_select_related = ["node"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: NodeModel | None = None) -> bool:
        return False
