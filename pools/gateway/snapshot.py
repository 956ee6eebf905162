"""The gateway's in-memory view of pools, targets and tokens, rebuilt on configuration changes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from nexus.models import ApiToken, ConfigVersion
from pools.balancer.snapshot import DrainState, PoolPolicy, SkipReason
from pools.models import Pool, Target, node_base_url


@dataclass(frozen=True, slots=True)
class TokenEntry:
    id: int
    name: str
    all_pools: bool
    pools: frozenset[str]
    expires_at: float | None  # epoch seconds

    def may_use(self, slug: str) -> bool:
        return self.all_pools or slug in self.pools


@dataclass(frozen=True, slots=True)
class TargetEntry:
    id: int
    name: str
    base_url: str
    model_id: str
    kinds: frozenset[str]
    authorization: str | None  # the full header value, e.g. "Bearer sk-..."
    urls: dict[str, httpx.URL]  # by request kind, parsed once per snapshot
    priority: int
    capacity: int
    position: int
    enabled: bool  # False too while its node may not take traffic (see `unavailable`)
    drain: DrainState
    unavailable: str = ""  # why a node target is out, e.g. "node gpu-1 is offline"


@dataclass(frozen=True, slots=True)
class PoolEntry:
    id: int
    slug: str
    name: str
    created: int
    targets: tuple[TargetEntry, ...]  # disabled and draining ones too: decisions explain them
    policy: PoolPolicy
    max_queue: int
    max_queue_wait_s: float
    max_attempts: int

    def target(self, target_id: int) -> TargetEntry:
        """Return the pool's target with this id."""
        return next(target for target in self.targets if target.id == target_id)


@dataclass(frozen=True, slots=True)
class Snapshot:
    version: int
    tokens: dict[str, TokenEntry]  # by token hash
    pools: dict[str, PoolEntry]  # by slug


EMPTY = Snapshot(version=-1, tokens={}, pools={})


# Request kind -> path below a target's OpenAI-compatible base URL.
KIND_PATHS = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
}


def _target_entry(target: Target) -> TargetEntry:
    node = target.node
    credential = target.upstream_credential()
    if node is None:
        base_url = target.base_url.rstrip("/")
        unavailable = ""
    else:
        # Reached through the node's agent, and only while the node is trusted and online;
        # a target the operator disabled is out for that reason alone.
        base_url = node_base_url(node.address)
        unavailable = node.unusable_reason() if target.enabled else ""
    return TargetEntry(
        id=target.pk,
        name=target.name,
        base_url=base_url,
        model_id=target.model_id,
        kinds=frozenset(target.kinds),
        authorization=f"Bearer {credential}" if credential else None,
        urls={kind: httpx.URL(base_url + path) for kind, path in KIND_PATHS.items()},
        priority=target.priority,
        capacity=target.capacity_weight,
        position=target.position,
        enabled=target.enabled and not unavailable,
        drain=DrainState(target.state),
        unavailable=unavailable,
    )


def explain_unavailable(pool: PoolEntry, skipped: Iterable[dict[str, Any]]) -> None:
    """Say why each target on an unusable node is out (the pure core sees it as disabled)."""
    for skip in skipped:
        if skip["reason"] == SkipReason.DISABLED and not skip["detail"]:
            target = next((t for t in pool.targets if t.id == skip["target_id"]), None)
            if target is not None and target.unavailable:
                skip["detail"] = target.unavailable


def pool_entry(pool: Pool) -> PoolEntry:
    """Return a pool as the gateway routes by it (its targets prefetched, ideally)."""
    targets = tuple(
        _target_entry(target)
        for target in sorted(pool.targets.all(), key=lambda t: (t.priority, t.position, t.pk))
    )
    return PoolEntry(
        id=pool.pk,
        slug=pool.slug,
        name=pool.name,
        created=int(pool.created_at.timestamp()),
        targets=targets,
        policy=PoolPolicy(
            strategy=pool.strategy,
            continuity_enabled=pool.continuity_enabled,
            continuity_threshold=pool.continuity_threshold,
        ),
        max_queue=pool.max_queue,
        max_queue_wait_s=pool.max_queue_wait_s,
        max_attempts=pool.max_attempts,
    )


def load_snapshot() -> Snapshot:
    """Read the configuration the gateway routes by (a handful of queries, off the hot path)."""
    version = ConfigVersion.current()
    tokens = {
        token.token_hash: TokenEntry(
            id=token.pk,
            name=token.name,
            all_pools=token.all_pools,
            pools=frozenset(token.pools),
            expires_at=token.expires_at.timestamp() if token.expires_at else None,
        )
        for token in ApiToken.objects.filter(revoked_at__isnull=True)
    }
    pools = {
        pool.slug: pool_entry(pool)
        for pool in Pool.objects.prefetch_related("targets", "targets__node")
    }
    return Snapshot(version=version, tokens=tokens, pools=pools)


def current_version() -> int:
    return ConfigVersion.current()
