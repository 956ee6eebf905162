"""Receivers that announce configuration changes to the gateway."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from nexus.models import ApiToken, ConfigVersion


@receiver(post_save, sender=ApiToken)
@receiver(post_delete, sender=ApiToken)
def announce_token_change(sender: type, **kwargs: object) -> None:
    ConfigVersion.bump()
