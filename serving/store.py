"""The model store: the model-store project's model folders as cards, and deploying one.

A card is a folder's `model-card.yaml` (serving.definitions.model_card), its README, and what
its two definition files allow: for each runtime variant its service-definition.toml names,
the presets whose slots fit that variant's resource slots (the model's minimum). A card that
cannot be deployed says why (docs/model-store.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import QuerySet

from nexus.models import DEFAULT_PROJECT, Project
from nodes.runtimes import RUNTIMES
from serving import folders, services
from serving.definitions import DefinitionError, parse_service_definition
from serving.definitions.model_card import DEFAULT_FILE as CARD_FILE
from serving.definitions.model_card import ModelCard, fits, read_model_card
from serving.models import (
    SERVICE_DEFINITION_NAME,
    ModelFolder,
    ResourceGroup,
    ResourcePreset,
    Service,
    ServiceLifecycle,
)
from serving.real_model import llama_cpp_installed
from serving.scheduler import slots_text

README_NAMES = ("README.md", "readme.md", "README")
NO_PRESET = "no compatible preset: this model cannot be deployed"
NEEDS_BOTH_FILES = "model-definition.yaml and service-definition.toml are both needed to deploy"
PAGE_SIZES = (10, 20, 50)
SORTS: Mapping[str, str] = {
    "name": "Name (A→Z)",
    "-name": "Name (Z→A)",
    "created": "Oldest",
    "-created": "Newest",
}
DEFAULT_SORT = "name"
# A card file or README larger than this is not read: they are short text.
MAX_TEXT_BYTES = 256 * 1024


def _llama_cpp_missing(folder: ModelFolder) -> str:
    if not llama_cpp_installed():
        return "llama.cpp is not installed here (make llama adds llama-cpp-python)"
    if not any(entry.path.endswith(".gguf") for entry in folders.list_files(folder).files):
        return "the folder holds no .gguf model file to serve (make llama brings SmolLM2's)"
    return ""


# What a runtime variant needs on this server beyond the folder's files: "" when it has it.
VARIANT_NEEDS: Mapping[str, Callable[[ModelFolder], str]] = {"llama-cpp": _llama_cpp_missing}


@dataclass(frozen=True)
class DeployOption:
    """One way to deploy a card: a runtime variant of its service definition on a preset."""

    variant: str
    preset: ResourcePreset

    @property
    def key(self) -> str:
        """Return the option's form value: "<variant>:<preset>"."""
        return f"{self.variant}:{self.preset.name}"

    @property
    def variant_label(self) -> str:
        return _variant_label(self.variant)


def _variant_label(variant: str) -> str:
    runtime = RUNTIMES.get(variant)
    return runtime.label if runtime is not None else variant


@dataclass(frozen=True)
class StoreCard:
    """A model folder as the store shows it."""

    folder: ModelFolder
    card: ModelCard
    # Per runtime variant of service-definition.toml: the slots the model needs at least.
    minimum: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    options: Sequence[DeployOption] = ()
    # Why it cannot be deployed; "" when it can.
    blocked: str = ""

    @property
    def title(self) -> str:
        return self.card.title or self.folder.name

    @property
    def minimum_text(self) -> list[tuple[str, str]]:
        """Return each runtime variant's minimum slots in words: [("llama.cpp", "1 CPU, 1 GiB")]."""
        return [(_variant_label(v), slots_text(dict(slots))) for v, slots in self.minimum.items()]

    @property
    def variants(self) -> list[str]:
        """Return the runtime variants the options span, in their order."""
        return list(dict.fromkeys(option.variant for option in self.options))


def store_project() -> Project | None:
    """Return the project whose model folders the store lists, None when there is none."""
    name = settings.NEXUS_MODEL_STORE_PROJECT
    return Project.objects.filter(name=name).first() if name else None


def store_folders(project: Project) -> QuerySet[ModelFolder]:
    return ModelFolder.objects.filter(project=project.name).select_related("owner")


def read_text(folder: ModelFolder, names: Sequence[str]) -> str | None:
    """Return the first of the named files at the folder's top level as text, None without one."""
    for name in names:
        path = folder.path / name
        if path.is_file() and path.stat().st_size <= MAX_TEXT_BYTES:
            return path.read_text(encoding="utf-8", errors="replace")
    return None


def readme(folder: ModelFolder) -> str | None:
    """Return the folder's README source, None without one."""
    return read_text(folder, README_NAMES)


def build_card(folder: ModelFolder, presets: Sequence[ResourcePreset]) -> StoreCard:
    """Return the folder's card with the ways it can be deployed, or why it cannot."""
    card = read_model_card(read_text(folder, (CARD_FILE,)))
    definition_text = read_text(folder, (SERVICE_DEFINITION_NAME,))
    if folder.model_definition_file is None or definition_text is None:
        return StoreCard(folder, card, blocked=NEEDS_BOTH_FILES)
    try:
        definition = parse_service_definition(definition_text)
    except DefinitionError as broken:
        return StoreCard(folder, card, blocked=str(broken).splitlines()[0])
    minimum = {
        variant: dict(defaults.resource_slots) for variant, defaults in definition.variants.items()
    }
    options: list[DeployOption] = []
    missing: list[str] = []
    for variant, slots in minimum.items():
        need = VARIANT_NEEDS.get(variant)
        why = need(folder) if need is not None else ""
        if why:
            missing.append(why)
            continue
        options.extend(DeployOption(variant, p) for p in presets if fits(p.slots(), slots))
    blocked = "" if options else (missing[0] if missing else NO_PRESET)
    return StoreCard(folder, card, minimum, options, blocked)


def store_cards(project: Project, *, search: str = "", sort: str = DEFAULT_SORT) -> list[StoreCard]:
    """Return the project's cards whose title or folder name holds `search`, sorted."""
    presets = list(ResourcePreset.objects.all())
    cards = [build_card(folder, presets) for folder in store_folders(project)]
    wanted = search.strip().casefold()
    if wanted:
        cards = [c for c in cards if wanted in f"{c.title}\n{c.folder.name}".casefold()]
    by_name = sort.lstrip("-") == "name"
    cards.sort(
        key=lambda c: (c.title.casefold(), c.folder.name) if by_name else c.folder.created_at,
        reverse=sort.startswith("-"),
    )
    return cards


def store_card(project: Project, name: str) -> StoreCard | None:
    """Return the card of one folder of the store, None when the store has no such folder."""
    folder = store_folders(project).filter(name=name).first()
    return build_card(folder, list(ResourcePreset.objects.all())) if folder else None


def resource_groups() -> QuerySet[ResourceGroup]:
    """Return the resource groups a store deployment may run on."""
    return ResourceGroup.objects.all()


def one_click(card: StoreCard, groups: Sequence[ResourceGroup]) -> bool:
    """Say whether the card deploys without asking: one option and one resource group."""
    return len(card.options) == 1 and len(groups) == 1


def service_name_for(folder: ModelFolder) -> str:
    """Return a free service name made from the folder's name: "qwen3-8b", then "qwen3-8b-2"."""
    # Room for a "-99" suffix within the name's length.
    base = re.sub(r"[^a-z0-9-]+", "-", folder.name.lower()).strip("-")
    base = base[: services.NAME_MAX_LENGTH - 4] or "model"
    taken = set(
        Service.objects.exclude(lifecycle=ServiceLifecycle.DESTROYED)
        .filter(name__startswith=base)
        .values_list("name", flat=True)
    )
    name, number = base, 1
    while name in taken:
        number += 1
        name = f"{base}-{number}"
    return name


def deploy(
    card: StoreCard,
    option: DeployOption,
    group: ResourceGroup,
    *,
    owner: User | None,
    project: str = DEFAULT_PROJECT,
) -> Service:
    """Create a service of one replica from the card's folder with the chosen option.

    The service definition supplies the variant's variables and slots (serving.launch); the
    preset's slots are what a replica reserves. Raise services.ServiceError when refused.
    """
    declaration: dict[str, Any] = {
        "name": service_name_for(card.folder),
        "model_folder": card.folder,
        "runtime_variant": option.variant,
        "project": project,
        "owner": owner,
        "resource_group": group,
        "preset": option.preset,
    }
    return services.create_service(**declaration)
