"""Push the fleet to the open nodes pages whenever a node changes, however it was changed."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from nodes import live
from nodes.models import Node, NodeModel


@receiver(post_save, sender=Node)
@receiver(post_delete, sender=Node)
@receiver(post_delete, sender=NodeModel)
def push_nodes_to_pages(sender: type, **kwargs: object) -> None:
    live.node_saved()
