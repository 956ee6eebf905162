"""What a client token may call, decided in one place; and which pools a token may name.

`may_call(scope, callee)` is the rule: the ORM token (`ApiToken.may_call`), the gateway's
snapshot entry (`TokenEntry.may_use`), the admin API's authentication and the metrics view all
ask it. It is pure (no Django), so the gateway runs it per request from its snapshot.

Tokens live in `nexus`, which every app depends on, so `nexus` cannot import `pools` to check a
pool slug; `pools` registers its lookup here when it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class CalleeKind(StrEnum):
    """What a token may be asked to call."""

    POOL = "pool"  # an operator's pool, `@pool/<slug>`
    SERVICE = "service"  # a model service: `/serve/<name>/` and its managed pool `@pool/<name>`
    ADMIN_API = "admin_api"  # /api/v1/
    METRICS = "metrics"  # /metrics when it is not public


@dataclass(frozen=True, slots=True)
class Callee:
    """One thing a token may call: a pool by slug, a service by name, or an API."""

    kind: CalleeKind
    name: str = ""


def pool(slug: str) -> Callee:
    """Return the callee of an operator's pool."""
    return Callee(CalleeKind.POOL, slug)


def service(name: str) -> Callee:
    """Return the callee of a model service (its URL and its managed pool alike)."""
    return Callee(CalleeKind.SERVICE, name)


ADMIN_API = Callee(CalleeKind.ADMIN_API)
METRICS = Callee(CalleeKind.METRICS)


@dataclass(frozen=True, slots=True)
class TokenScope:
    """What a token names: every ordinary pool, some pools, and services (a service token)."""

    all_pools: bool
    pools: frozenset[str] = frozenset()
    services: frozenset[str] = frozenset()


def may_call(scope: TokenScope, callee: Callee) -> bool:
    """Say whether a token of this scope may call the callee (validity is checked apart).

    A service is reached only by a token that names it, never by an all-pools token; the admin
    API and the metrics, which name every pool and target, by no service token; the metrics by
    no token limited to some pools either.
    """
    kind = callee.kind
    if kind is CalleeKind.POOL:
        return scope.all_pools or callee.name in scope.pools
    if kind is CalleeKind.SERVICE:
        return callee.name in scope.services
    if scope.services:
        return False
    if kind is CalleeKind.ADMIN_API:
        return True
    return scope.all_pools


PoolSlugs = Callable[[], set[str]]

_pool_slugs: PoolSlugs | None = None


def provide_pool_slugs(lookup: PoolSlugs) -> None:
    """Register the function that returns every pool slug (called by the pools app)."""
    global _pool_slugs
    _pool_slugs = lookup


def pool_slugs() -> set[str]:
    """Return the slugs of all pools a token could be scoped to."""
    if _pool_slugs is None:
        raise RuntimeError("the pools app has not registered its pool lookup")
    return _pool_slugs()


def unknown_pool_slugs(slugs: list[str]) -> list[str]:
    """Return the given slugs that name no pool, sorted."""
    return sorted(set(slugs) - pool_slugs()) if slugs else []
