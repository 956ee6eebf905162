"""Push pool and target changes to every open pools page; keep node targets' URLs in step.

(The gateways hear of configuration changes from the models themselves: nexus.models.ConfigInput.)
"""

from __future__ import annotations

from functools import partial

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from nexus.models import ApiToken
from nodes.models import Node
from nodes.signals import node_state_changed
from pools import live
from pools.gateway import revocations
from pools.models import Pool, Target, node_base_url


@receiver(post_save, sender=Pool)
@receiver(post_delete, sender=Pool)
@receiver(post_save, sender=Target)
@receiver(post_delete, sender=Target)
def push_pools_to_pages(sender: type, **kwargs: object) -> None:
    # After commit, so that pages never show a change that is then rolled back.
    transaction.on_commit(live.pools_changed, robust=True)


@receiver(node_state_changed)
def push_pools_after_a_node_changed(sender: type, node: Node, **kwargs: object) -> None:
    # A target's row shows its node's state: offline or untrusted, it takes no traffic.
    if node.targets.exists():
        live.pools_changed()


@receiver(post_save, sender=Node)
def follow_node_address(sender: type, instance: Node, **kwargs: object) -> None:
    # The snapshot derives a node target's URL from the node; the stored one is for display.
    # A managed pool's target is one replica process on the agent, with a URL of its own.
    base_url = node_base_url(instance.address)
    Target.objects.filter(node=instance, pool__managed=False).exclude(base_url=base_url).update(
        base_url=base_url
    )


@receiver(post_save, sender=ApiToken)
def announce_revocation(
    sender: type,
    instance: ApiToken,
    update_fields: frozenset[str] | None = None,
    **kwargs: object,
) -> None:
    # Every way of revoking (API, admin, command, service tokens) goes through ApiToken.revoke(),
    # which saves revoked_at alone; the gateways drop the token before the revoking call returns.
    if instance.revoked_at is not None and "revoked_at" in (update_fields or ()):
        transaction.on_commit(partial(revocations.announce, instance.token_hash))
