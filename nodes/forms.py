"""The Nodes page's form: where the agent is and the credential it expects."""

from __future__ import annotations

from django import forms


class NodeAddForm(forms.Form):
    """Ask for what services.add_node takes; reaching the agent is its check."""

    name = forms.SlugField(max_length=64, help_text="Letters, digits, - and _; e.g. gpu-1.")
    # Agents serve plain HTTP on the operator's own network (docs/nodes.md).
    address = forms.URLField(
        max_length=500,
        assume_scheme="http",
        help_text="The agent's URL, as it printed it at start, e.g. http://10.0.0.5:7100",
    )
    credential = forms.CharField(
        max_length=500,
        widget=forms.PasswordInput(render_value=False),
        help_text="The node credential the agent expects. Stored encrypted, never shown again.",
    )
