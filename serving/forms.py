"""Forms of the model serving pages."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any, cast

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS
from django.utils import timezone
from django.utils.text import slugify

from nodes.models import Node
from nodes.runtimes import RUNTIMES, Parameter, Runtime
from serving import services
from serving.autoscaling import PRESETS_BY_KEY, Condition, MetricSource, step_sign, with_preset
from serving.definitions.command_import import DEFAULT_MOUNT
from serving.launch import COMMAND_SETTINGS, MAX_CLUSTER_SIZE, LaunchProblem
from serving.models import (
    FOLDER_NAME_HELP,
    FOLDER_NAME_MAX_LENGTH,
    SERVICE_DEFINITION_NAME,
    AutoScalingRule,
    FolderUsage,
    ModelFolder,
    ResourceGroup,
    ResourcePreset,
    Service,
    validate_folder_name,
)
from serving.scheduler import slots_text
from serving.store import DeployOption, StoreCard

# A service token always expires (DESIGN.md); ten years is the longest the form offers.
MAX_TOKEN_DAYS = 3650
DEFAULT_TOKEN_DAYS = 30
# A pasted command's settings (launch.COMMAND_SETTINGS) by the form field that holds each: the
# setting's own name, but the port's ("port" alone would read as the service's).
SETTING_FIELDS = {key: "command_port" if key == "port" else key for key in COMMAND_SETTINGS}
CUSTOM_MODES = [
    ("command", "a command line"),
    ("definition", "the folder's model definition"),
]
CLUSTER_MODES = [
    ("single", "Single Node"),
    ("multi", "Multi Node"),
]


class ModelFolderForm(forms.Form):
    """A new model folder: its name, project and what it is for."""

    name = forms.CharField(
        max_length=FOLDER_NAME_MAX_LENGTH,
        validators=[validate_folder_name],
        help_text=FOLDER_NAME_HELP,
    )
    project = forms.CharField(max_length=100, initial="default")
    usage = forms.ChoiceField(
        choices=FolderUsage.choices,
        initial=FolderUsage.MODEL,
        required=False,
        help_text="General and data folders are mounted beside a model folder (extra mounts).",
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def clean_usage(self) -> str:
        return self.cleaned_data["usage"] or FolderUsage.MODEL


class NodeChoices(forms.ModelMultipleChoiceField):
    """Nodes as checkboxes, each labelled with its trust and status."""

    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.name} ({obj.get_trust_display().lower()}, {obj.get_status_display().lower()})"


class ResourceGroupForm(forms.ModelForm):
    """A resource group: its name (fixed once made), and every trusted node or a list."""

    nodes = NodeChoices(
        queryset=Node.objects.order_by("name"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Only trusted, online nodes take replicas; ignored with every node chosen.",
    )

    class Meta:
        model = ResourceGroup
        fields = ["name", "description", "all_nodes", "nodes"]
        labels = {"all_nodes": "Every node"}
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            # Revisions name their group; renaming it would rewrite where they ran.
            self.fields["name"].disabled = True

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not cleaned.get("all_nodes") and not cleaned.get("nodes"):
            self.add_error("nodes", "Choose the nodes, or every node.")
        return cleaned


class ServiceLaunchForm(forms.Form):
    """The service launcher: a name, a model folder, a runtime variant and its settings.

    Only the shapes are checked here; `serving.services.check_service` checks the values, so
    the page and the API refuse the same things with the same words. The variables of the
    chosen variant (VLLM_TP_SIZE …) are fields of their own, named `env_<NAME>`.
    """

    name = forms.CharField(
        label="Service name",
        max_length=services.NAME_MAX_LENGTH,
        help_text="Letters, digits, '-' and '_'; it is in the URL: /serve/<name>/.",
    )
    model_folder = forms.ChoiceField(label="Model folder")
    runtime_variant = forms.ChoiceField(
        label="Runtime variant",
        choices=[(variant.name, variant.label) for variant in RUNTIMES.values()],
        initial="vllm",
    )
    custom_mode = forms.ChoiceField(
        label="Define the service by",
        choices=CUSTOM_MODES,
        initial="command",
        required=False,
        widget=forms.RadioSelect,
    )
    command = forms.CharField(
        label="Command line",
        required=False,
        strip=False,
        widget=forms.Textarea(
            attrs={"rows": 3, "placeholder": "vllm serve /models/my-model --tp 2"}
        ),
        help_text="Pasted as you would run it (docker run and sh -c are read too); nothing "
        "runs until the service starts.",
    )
    # A pasted command's settings: empty means what the command gives (or the default).
    command_port = forms.IntegerField(
        label="Port",
        required=False,
        widget=forms.NumberInput(attrs={"min": 1, "max": 65535, "placeholder": "8000"}),
        help_text="Where the command listens; leave empty for its --port (default 8000) or for "
        "${PORT} in the command, which the agent allocates.",
    )
    health_path = forms.CharField(
        label="Health path",
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "/health"}),
        help_text="Probed for HTTP 200; empty for the command's (default /health).",
    )
    interval = forms.FloatField(
        label="Probe interval (s)",
        required=False,
        widget=forms.NumberInput(attrs={"step": "any", "placeholder": "10.0"}),
        help_text="Seconds between health probes, the first one included.",
    )
    initial_delay = forms.FloatField(
        label="Initial delay (s)",
        required=False,
        widget=forms.NumberInput(attrs={"min": 0, "step": "any", "placeholder": "60.0"}),
    )
    max_retries = forms.IntegerField(
        label="Max retries",
        required=False,
        widget=forms.NumberInput(attrs={"min": 0, "placeholder": "10"}),
    )
    model_definition_path = forms.CharField(
        label="Model definition file",
        required=False,
        help_text="In the model folder; model-definition.yaml when left empty.",
    )
    extra_mounts = forms.CharField(
        label="Extra mounts",
        required=False,
        widget=forms.Textarea(
            attrs={"rows": 2, "placeholder": "folder=/destination, one per line"}
        ),
        help_text="General or data folders the definition's service also sees.",
    )
    mount_destination = forms.CharField(
        label="Mount destination",
        initial=DEFAULT_MOUNT,
        help_text="Where the folder appears to the command.",
    )
    variables = forms.CharField(
        label="More variables",
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "NAME=value, one per line"}),
    )
    desired_replicas = forms.IntegerField(
        label="Replicas",
        initial=1,
        widget=forms.NumberInput(attrs={"min": 0, "max": services.MAX_REPLICAS}),
    )
    cluster_mode = forms.ChoiceField(
        label="Cluster mode",
        choices=CLUSTER_MODES,
        initial="single",
        required=False,
        widget=forms.RadioSelect,
        help_text="Multi Node: each replica is one main and workers, each on its own node.",
    )
    cluster_size = forms.IntegerField(
        label="Nodes per replica",
        required=False,
        initial=2,
        widget=forms.NumberInput(attrs={"min": 2, "max": MAX_CLUSTER_SIZE}),
        help_text="The main and its workers (Multi Node only).",
    )
    resource_group = forms.ChoiceField(label="Resource group")
    preset = forms.ChoiceField(label="Resource preset", required=False)
    open_to_public = forms.BooleanField(
        label="Open to public", required=False, help_text="Reachable without a token."
    )

    def __init__(self, *args: Any, editing: Service | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Editing a service: its name is fixed (it is the URL); the rest makes its next revision.
        self.editing = editing
        if editing is not None:
            self.fields["name"].disabled = True
            self.fields["name"].initial = editing.name
        folders = cast("forms.ChoiceField", self.fields["model_folder"])
        folders.choices = [
            (name, name) for name in ModelFolder.objects.values_list("name", flat=True)
        ]
        groups = cast("forms.ChoiceField", self.fields["resource_group"])
        groups.choices = [
            (name, name) for name in ResourceGroup.objects.values_list("name", flat=True)
        ]
        groups.initial = services.DEFAULT_GROUP
        presets = cast("forms.ChoiceField", self.fields["preset"])
        presets.choices = [("", "none: service-definition.toml's slots, if any")] + [
            (preset.name, f"{preset.name}: {slots_text(preset.slots())}")
            for preset in ResourcePreset.objects.all()
        ]
        for name, meaning in self.variant.env_vars.items():
            self.fields[env_field(name)] = forms.CharField(
                label=name, required=False, help_text=meaning
            )
        table = self.variant.parameters
        for parameter in table.parameters if table else ():
            self.fields[parameter_field(parameter.key)] = parameter_form_field(parameter)

    @property
    def variant(self) -> Runtime:
        """Return the runtime variant chosen (the initial one while unbound or unknown)."""
        chosen = self.data.get("runtime_variant") if self.is_bound else None
        return RUNTIMES.get(str(chosen), RUNTIMES[self.fields["runtime_variant"].initial])

    @property
    def mode(self) -> str:
        """Return how a Custom service is defined: "command" or "definition"."""
        chosen = self.data.get("custom_mode") if self.is_bound else None
        return chosen if chosen in dict(CUSTOM_MODES) else "command"

    @property
    def cluster(self) -> str:
        """Return the cluster mode chosen: "single" or "multi"."""
        chosen = self.data.get("cluster_mode") if self.is_bound else None
        return chosen if chosen in dict(CLUSTER_MODES) else "single"

    def parameter_tabs(self) -> list[dict[str, Any]]:
        """Return the chosen runtime's parameter tabs, each with its fields, for the template."""
        table = self.variant.parameters
        if table is None:
            return []
        return [
            {
                "name": tab,
                "slug": slugify(tab),
                "fields": [
                    (self[parameter_field(p.key)], p.flag, parameter_field(p.key))
                    for p in table.in_tab(tab)
                ],
            }
            for tab in table.tabs
        ]

    def error_slot_fields(self) -> list[forms.BoundField]:
        """Return the fields whose errors the live check shows next to them: every field
        with a row of its own (the radio groups have none)."""
        return [self[name] for name in self.fields if name not in ("custom_mode", "cluster_mode")]

    def variable_fields(self) -> list[forms.BoundField]:
        """Return the chosen variant's own variables, for the template."""
        return [self[env_field(name)] for name in self.variant.env_vars]

    def clean_variables(self) -> dict[str, str]:
        """Return the NAME=value lines as variables; blank lines and # comments are skipped."""
        found: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["variables"].splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, equals, value = line.partition("=")
            if not equals:
                raise forms.ValidationError(f"line {number}: write NAME=value")
            found[name.strip()] = value
        return found

    def clean_extra_mounts(self) -> list[dict[str, str]]:
        """Return the folder=/destination lines as mounts; blank lines are skipped."""
        found = []
        for number, line in enumerate(self.cleaned_data["extra_mounts"].splitlines(), start=1):
            if not line.strip():
                continue
            folder, equals, destination = line.partition("=")
            if not equals:
                raise forms.ValidationError(f"line {number}: write folder=/destination")
            found.append({"folder": folder.strip(), "destination": destination.strip()})
        return found

    def declaration(self) -> dict[str, Any]:
        """Return the cleaned form as `check_service`'s arguments."""
        data = self.cleaned_data
        custom = self.variant.command is None
        environ = {
            name: data[env_field(name)]
            for name in self.variant.env_vars
            if data.get(env_field(name), "").strip()
        }
        return {
            "name": data["name"],
            "model_folder": data["model_folder"],
            "runtime_variant": data["runtime_variant"],
            "command": data["command"] if custom and self.mode == "command" else "",
            "command_settings": self.command_settings()
            if custom and self.mode == "command"
            else {},
            "model_definition_path": (
                data["model_definition_path"] if custom and self.mode == "definition" else ""
            ),
            "extra_mounts": data["extra_mounts"] if custom and self.mode == "definition" else [],
            "mount_destination": data["mount_destination"],
            "environ": {**environ, **data["variables"]},
            "runtime_parameters": {
                key: data[parameter_field(key)]
                for key in (self.variant.parameters.by_key if self.variant.parameters else {})
                if data.get(parameter_field(key), "").strip()
            },
            "cluster_size": (data.get("cluster_size") or 0) if self.cluster == "multi" else 1,
            "desired_replicas": data["desired_replicas"],
            "resource_group": data["resource_group"],
            "preset": data["preset"] or None,
            "open_to_public": data["open_to_public"],
        }

    def changes(self) -> dict[str, Any]:
        """Return the cleaned form as `update_service`'s changes (all but the fixed name)."""
        return {key: value for key, value in self.declaration().items() if key != "name"}

    def command_settings(self) -> dict[str, Any]:
        """Return the pasted command's settings that were filled in."""
        values = {key: self.cleaned_data.get(field) for key, field in SETTING_FIELDS.items()}
        return {key: value for key, value in values.items() if value not in (None, "")}

    def field_of(self, problem: LaunchProblem) -> str | None:
        """Return the form field a problem belongs to, or None when it is none of the form's.

        "runtime_parameters.dtype" is the field param_dtype, "environ.X" the variant's
        variable X (else the variables box); a problem in service-definition.toml belongs to
        the model folder, one in the model definition to its path (or the folder).
        """
        if problem.file:
            if problem.file != SERVICE_DEFINITION_NAME and self.mode == "definition":
                return "model_definition_path"
            return "model_folder"
        if problem.path.startswith("extra_mounts"):
            return "extra_mounts"
        head, _, key = problem.path.partition(".")
        if head == "command_settings":
            return SETTING_FIELDS.get(key, key) if key else "command"
        if head == "runtime_parameters" and parameter_field(key) in self.fields:
            return parameter_field(key)
        if head == "environ":
            return env_field(key) if env_field(key) in self.fields else "variables"
        return head if head in self.fields else None

    def problems(self) -> list[LaunchProblem]:
        """Return the form's own errors as problems at their fields."""
        return [
            LaunchProblem("", "" if field == NON_FIELD_ERRORS else field, str(message))
            for field, messages in self.errors.items()
            for message in messages
        ]


def form_data_of(service: Service) -> dict[str, str]:
    """Return the launcher's form filled in from the service and its latest revision, as a
    browser would send it (Edit opens the launcher with it)."""
    latest = service.latest_revision
    assert latest is not None, "every service is created with its first revision"
    variant = RUNTIMES.get(latest.runtime_variant)
    own = variant.env_vars if variant else {}
    data = {
        "name": service.name,
        "model_folder": latest.model_folder_name,
        "runtime_variant": latest.runtime_variant,
        "custom_mode": "command" if latest.command else "definition",
        "command": latest.command,
        "model_definition_path": latest.model_definition_path,
        "extra_mounts": "\n".join(
            f"{mount['folder']}={mount['destination']}"
            for mount in latest.spec.get("extra_mounts") or []
        ),
        "mount_destination": latest.mount_destination,
        "variables": "\n".join(
            f"{name}={value}" for name, value in latest.environ.items() if name not in own
        ),
        "desired_replicas": str(service.desired_replicas),
        "cluster_mode": "multi" if latest.cluster_size > 1 else "single",
        "cluster_size": str(latest.cluster_size if latest.cluster_size > 1 else 2),
        "resource_group": latest.resource_group.name,
        "preset": latest.preset.name if latest.preset else "",
        **{env_field(name): value for name, value in latest.environ.items() if name in own},
        **{parameter_field(key): str(value) for key, value in latest.runtime_parameters.items()},
    }
    settings = latest.command_settings
    for key, field in SETTING_FIELDS.items():
        if key in settings:
            data[field] = str(settings[key])
    if service.open_to_public:
        data["open_to_public"] = "on"
    return data


def parameter_field(key: str) -> str:
    """Return the form field of a runtime parameter."""
    return f"param_{key}"


def parameter_form_field(parameter: Parameter) -> forms.Field:
    """Return a text field for a parameter: its value is checked by the catalogue, so the page
    and the API refuse the same things with the same words; the widget only hints."""
    attrs: dict[str, Any] = {"data-flag": parameter.flag}
    if parameter.placeholder:
        attrs["placeholder"] = parameter.placeholder
    if parameter.kind == "choice":
        choices = [("", "default"), *((choice, choice) for choice in parameter.choices)]
        return forms.ChoiceField(
            label=parameter.label,
            required=False,
            choices=choices,
            help_text=parameter.help,
            widget=forms.Select(attrs=attrs),
        )
    if parameter.kind == "bool":
        choices = [("", "default"), ("true", "on"), ("false", "off")]
        return forms.ChoiceField(
            label=parameter.label,
            required=False,
            choices=choices,
            help_text=parameter.help,
            widget=forms.Select(attrs=attrs),
        )
    if parameter.kind in ("int", "float"):
        attrs["inputmode"] = "numeric" if parameter.kind == "int" else "decimal"
    return forms.CharField(
        label=parameter.label,
        required=False,
        strip=False,
        help_text=parameter.help,
        widget=forms.TextInput(attrs=attrs),
    )


def env_field(name: str) -> str:
    """Return the form field of a variant's variable."""
    return f"env_{name}"


class ServiceTokenForm(forms.Form):
    """A new service token: what it is for and the last day it works (the reference asks for
    an expiry date)."""

    name = forms.CharField(max_length=100, help_text="What or who uses it, e.g. chat-app.")
    expires_on = forms.DateField(
        label="Valid until",
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="It works through the end of this day (UTC).",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        today = timezone.localdate()
        self.fields["expires_on"].initial = today + timedelta(days=DEFAULT_TOKEN_DAYS)
        self.fields["expires_on"].widget.attrs.update(
            min=(today + timedelta(days=1)).isoformat(),
            max=(today + timedelta(days=MAX_TOKEN_DAYS)).isoformat(),
        )

    def clean_expires_on(self) -> date:
        chosen: date = self.cleaned_data["expires_on"]
        today = timezone.localdate()
        if chosen <= today:
            raise forms.ValidationError("Choose a day after today.")
        if chosen > today + timedelta(days=MAX_TOKEN_DAYS):
            raise forms.ValidationError(f"Choose a day within {MAX_TOKEN_DAYS} days.")
        return chosen

    def expires_at(self) -> datetime:
        """Return when the token stops working: the start of the day after the chosen one."""
        following = self.cleaned_data["expires_on"] + timedelta(days=1)
        return timezone.make_aware(datetime.combine(following, time.min))


class AutoScalingRuleForm(forms.ModelForm):
    """The autoscaling rule editor: the document's fields, in its order."""

    # The preset whose values the editor last filled in: a redraw fills a preset's values only
    # when it was just chosen, so that a query edited afterwards is kept.
    applied_preset = forms.CharField(required=False, widget=forms.HiddenInput)

    class Meta:
        model = AutoScalingRule
        fields = [
            "metric_source",
            "metric_name",
            "prometheus_preset",
            "prometheus_query",
            "condition",
            "min_threshold",
            "max_threshold",
            "step_size",
            "cooldown_s",
            "min_replicas",
            "max_replicas",
            "aggregation",
            "window_s",
        ]
        labels = {
            "prometheus_preset": "Metric name (Prometheus preset)",
            "prometheus_query": "Query",
            "cooldown_s": "Cooldown (s)",
            "window_s": "Window (s)",
        }
        widgets = {
            "metric_source": forms.RadioSelect,
            "condition": forms.RadioSelect,
            "metric_name": forms.TextInput(attrs={"list": "kernel-metrics"}),
            "prometheus_query": forms.Textarea(attrs={"rows": 2}),
        }

    def __init__(self, *args: Any, service: Service, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.instance.service = service
        if "applied_preset" not in self.initial:
            self.initial["applied_preset"] = self.instance.prometheus_preset
        preset = cast("forms.ChoiceField", self.fields["prometheus_preset"])
        for name in ("metric_source", "condition"):
            radios = cast("forms.ChoiceField", self.fields[name])
            # Radio buttons need no "---------" choice: the field is required.
            choices = cast("list[tuple[str, str]]", radios.choices)
            radios.choices = [(value, label) for value, label in choices if value]
        presets = [(p.key, p.label) for p in PRESETS_BY_KEY.values()]
        preset.choices = [("", "— none (write the query) —"), *presets]

    @property
    def step_text(self) -> str:
        """Return the step as the rule list shows it, signed by the condition: "±1"."""
        condition = str(self["condition"].value() or "")
        step = str(self["step_size"].value() or "")
        if condition not in Condition.__members__.values():
            return step
        return f"{step_sign(condition)}{step}"

    @property
    def is_prometheus(self) -> bool:
        source = self["metric_source"].value()
        return str(source) == MetricSource.PROMETHEUS

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # A preset fills what the editor left empty (the API does the same).
        return with_preset(cleaned, keep=["cooldown_s"])


def preset_filled(
    data: Any, service: Service, instance: AutoScalingRule | None
) -> AutoScalingRuleForm:
    """Return the editor redrawn for a changed source, preset, condition or step: a preset
    just chosen fills its metric name, query and cooldown; no errors are shown yet."""
    values = {name: data.get(name, "") for name in AutoScalingRuleForm.Meta.fields}
    preset = PRESETS_BY_KEY.get(values["prometheus_preset"])
    values["applied_preset"] = values["prometheus_preset"]
    chosen_now = values["prometheus_preset"] != data.get("applied_preset", "")
    if preset is not None and chosen_now and values["metric_source"] == MetricSource.PROMETHEUS:
        values["metric_name"] = preset.metric
        values["prometheus_query"] = preset.query
        if preset.cooldown_s is not None:
            values["cooldown_s"] = str(preset.cooldown_s)
    return AutoScalingRuleForm(initial=values, instance=instance, service=service)


class StoreDeployForm(forms.Form):
    """The model store's deploy modal: a preset (grouped by runtime variant when the card's
    options span several) and a resource group."""

    option = forms.ChoiceField(label="Preset")
    resource_group = forms.ModelChoiceField(
        label="Resource group", queryset=ResourceGroup.objects.none(), empty_label=None
    )

    def __init__(self, *args: Any, card: StoreCard, groups: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.card = card
        by_variant: dict[str, tuple[str, list[tuple[str, str]]]] = {}
        for option in card.options:
            text = f"{option.preset.name} ({slots_text(option.preset.slots())})"
            by_variant.setdefault(option.variant, (option.variant_label, []))[1].append(
                (option.key, text)
            )
        field = cast("forms.ChoiceField", self.fields["option"])
        if len(by_variant) > 1:
            field.choices = list(by_variant.values())
        else:
            field.choices = [c for _, choices in by_variant.values() for c in choices]
        cast("forms.ModelChoiceField", self.fields["resource_group"]).queryset = groups

    def chosen_option(self) -> DeployOption:
        """Return the card's deploy option the form chose."""
        key = self.cleaned_data["option"]
        return next(o for o in self.card.options if o.key == key)
