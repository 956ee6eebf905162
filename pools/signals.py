"""Announce pool and target changes so every gateway rebuilds its snapshot."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from nexus.models import ConfigVersion
from pools.models import Pool, Target


@receiver(post_save, sender=Pool)
@receiver(post_delete, sender=Pool)
@receiver(post_save, sender=Target)
@receiver(post_delete, sender=Target)
def announce_pool_change(sender: type, **kwargs: object) -> None:
    ConfigVersion.bump()
