"""Rows every installation has, so that a first service needs no setup."""

from __future__ import annotations

from typing import Any

# "default" spans every trusted node; the presets are the sizes most replicas want.
DEFAULT_GROUP = "default"
PRESETS = [
    ("cpu-small", 1.0, 1 << 30, 0.0),
    ("cpu-medium", 2.0, 4 << 30, 0.0),
    ("cpu-large", 4.0, 8 << 30, 0.0),
    ("gpu-1", 4.0, 16 << 30, 1.0),
]


def create_defaults(using: str = "default", **kwargs: Any) -> None:
    """Create the default resource group and presets where missing (after every migrate).

    A post_migrate receiver rather than a data migration: a flushed database (tests, `flush`)
    gets them back too, since flush sends post_migrate.
    """
    from serving.models import ResourceGroup, ResourcePreset

    ResourceGroup.objects.using(using).get_or_create(
        name=DEFAULT_GROUP, defaults={"all_nodes": True, "description": "Every trusted node."}
    )
    for name, cpu, memory, shares in PRESETS:
        ResourcePreset.objects.using(using).get_or_create(
            name=name, defaults={"cpu": cpu, "memory_bytes": memory, "cuda_shares": shares}
        )
