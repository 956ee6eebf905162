"""Nodes pages: the fleet, adding a node, confirming its fingerprint, a node's detail."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from nexus import live
from nexus.pages import HtmxHttpRequest, render_page_or_fragment, staff_required
from nodes import services
from nodes.forms import NodeAddForm
from nodes.live import NODE_LIST, NODES_TABLE, nodes_table_context
from nodes.models import Node, NodeTrust

NODE_DETAIL = "nodes/node_detail.html"
NODE_STATE = f"{NODE_DETAIL}#node-state"


@require_GET
@login_required
def node_list(request: HtmxHttpRequest) -> HttpResponse:
    """Render the fleet, or only its table for an htmx request; live over /ws/nodes/."""
    context = nodes_table_context(live.audience_of(request.user))
    return render_page_or_fragment(request, NODE_LIST, NODES_TABLE, context)


@require_http_methods(["GET", "POST"])
@staff_required("change nodes")
def node_add(request: HttpRequest) -> HttpResponse:
    """Show the form; on a valid post prove the agent's identity and show its fingerprint."""
    form = NodeAddForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            node = services.add_node(**form.cleaned_data)
        except services.NodeError as error:
            form.add_error(None, str(error))
        else:
            return redirect("nodes:confirm", name=node.name)
    status = 400 if form.errors else 200
    return render(request, "nodes/node_add.html", {"form": form, "section": "nodes"}, status=status)


@require_http_methods(["GET", "POST"])
@staff_required("change nodes")
def node_confirm(request: HttpRequest, name: str) -> HttpResponse:
    """Show the fingerprint to compare; a post confirms it (the one shown, so it must match)."""
    node = get_object_or_404(Node, name=name)
    error = ""
    if request.method == "POST":
        try:
            services.confirm_node(node, request.POST.get("fingerprint", ""))
        except services.NodeError as refusal:
            error = str(refusal)
        else:
            messages.success(request, f"Node {node.name} is trusted.")
            return redirect("nodes:detail", name=node.name)
    context = {"node": node, "error": error, "section": "nodes"}
    return render(request, "nodes/node_confirm.html", context, status=400 if error else 200)


@require_POST
@staff_required("change nodes")
def node_reject(request: HttpRequest, name: str) -> HttpResponse:
    """Refuse the node: no traffic and no work."""
    node = services.reject_node(get_object_or_404(Node, name=name))
    messages.info(request, f"Node {node.name} is rejected: it gets no traffic and no work.")
    return redirect("nodes:detail", name=node.name)


@require_GET
@login_required
def node_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Render a node's identity, resources, metrics and inventory (its state only, for htmx)."""
    node = get_object_or_404(Node.objects.prefetch_related("models"), name=name)
    return render_page_or_fragment(request, NODE_DETAIL, NODE_STATE, _detail(node))


@require_POST
@staff_required("change nodes")
def node_refresh(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Read the node now; answer htmx with the refreshed state, anyone else with a redirect."""
    node = services.refresh_node(get_object_or_404(Node, name=name))
    if request.htmx:
        node = Node.objects.prefetch_related("models").get(pk=node.pk)
        return render(request, NODE_STATE, _detail(node))
    return redirect("nodes:detail", name=node.name)


def _detail(node: Node) -> dict[str, Any]:
    return {
        "node": node,
        "inventory": list(node.models.all()),
        "pending": node.trust == NodeTrust.PENDING,
        "section": "nodes",
    }
