"""Push the fleet to the open nodes pages whenever a node changes, however it was changed; tell
whoever shows nodes elsewhere when a node's status, trust or models changed."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal, receiver

from nodes import live
from nodes.models import Node, NodeModel

# Sent (sender=Node, node=the node) once a refresh that changed whether a node may take traffic,
# or what it serves, has committed: pages that show a node's state elsewhere listen.
node_state_changed = Signal()


@receiver(post_save, sender=Node)
@receiver(post_delete, sender=Node)
@receiver(post_delete, sender=NodeModel)
def push_nodes_to_pages(sender: type, **kwargs: object) -> None:
    live.node_saved()
