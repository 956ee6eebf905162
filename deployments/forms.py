"""The deployment page's form: usable nodes to pick, a runtime and a model source."""

from __future__ import annotations

import shlex

from django import forms

from deployments.models import Deployment, ModelSource, Runtime
from nodes import services as node_services


class DeploymentForm(forms.Form):
    """Ask for what services.create_deployment takes; it does the checking that matters."""

    name = forms.CharField(max_length=100)
    # A lazy queryset, evaluated afresh for every form: nodes come and go.
    nodes = forms.ModelMultipleChoiceField(
        queryset=node_services.usable_nodes(),
        to_field_name="name",
        widget=forms.CheckboxSelectMultiple,
        help_text="Only trusted, online nodes can take a deployment.",
    )
    runtime = forms.ChoiceField(choices=Runtime.choices, initial=Runtime.SIMULATOR)
    runtime_requirement = forms.CharField(
        max_length=300,
        required=False,
        label="Runtime requirement",
        help_text=Deployment._meta.get_field("runtime_requirement").help_text,
    )
    runtime_argv = forms.CharField(
        max_length=2000,
        required=False,
        label="Custom command",
        help_text="Custom runtime only, as a shell would split it: "
        "my-server --model ${MODEL_PATH} --port ${PORT}",
    )
    model_source = forms.ChoiceField(
        choices=ModelSource.choices, initial=ModelSource.HTTP, widget=forms.RadioSelect
    )
    model_location = forms.CharField(
        max_length=1000,
        label="Model location",
        help_text=Deployment._meta.get_field("model_location").help_text,
    )
    model_file = forms.CharField(
        max_length=300,
        required=False,
        label="Model file",
        help_text=Deployment._meta.get_field("model_file").help_text,
    )
    model_sha256 = forms.CharField(
        max_length=64,
        required=False,
        label="SHA-256",
        help_text=Deployment._meta.get_field("model_sha256").help_text,
    )
    model_name = forms.CharField(
        max_length=200,
        label="Model id",
        help_text=Deployment._meta.get_field("model_name").help_text,
    )

    def clean_runtime_argv(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data["runtime_argv"])
        except ValueError as error:
            raise forms.ValidationError(f"Cannot split the command: {error}.") from None
