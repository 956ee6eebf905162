"""Receivers that announce configuration changes to every gateway (see ConfigInput)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db.models.signals import post_delete, post_save

from nexus.models import ConfigInput, ConfigVersion


def config_inputs() -> list[type[ConfigInput]]:
    """Return every model the gateway's snapshot reads."""
    return [model for model in apps.get_models() if issubclass(model, ConfigInput)]


def announce_saved(
    sender: type[ConfigInput],
    instance: ConfigInput,
    created: bool,
    update_fields: frozenset[str] | None = None,
    **kwargs: Any,
) -> None:
    changed = instance.config_changed(update_fields)
    if created or changed:
        ConfigVersion.bump()


def announce_deleted(sender: type[ConfigInput], **kwargs: Any) -> None:
    ConfigVersion.bump()


def connect_config_inputs() -> None:
    """Announce every save and delete of a config input (called once all models are loaded).

    Connected per model, not for every sender: a receiver for all models would stop Django from
    deleting any model's rows in bulk without loading them (history pruning, for one).
    """
    for model in config_inputs():
        post_save.connect(announce_saved, sender=model, dispatch_uid=f"config-save-{model}")
        post_delete.connect(announce_deleted, sender=model, dispatch_uid=f"config-del-{model}")
