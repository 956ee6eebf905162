"""What a token may call, decided in one place; and which pools a token may name.

Two kinds of token: a *client* token calls inference only (/v1 and /serve/<name>/, the pools
and services it names); an *admin* token calls the admin API (reads, or reads and writes) and
the metrics, never inference. `may_call(scope, callee)` is the rule: the ORM token
(`ApiToken.may_call`), the gateway's snapshot entry (`TokenEntry.may_use`), the admin API's
authentication and the metrics view all ask it. It is pure (no Django), so the gateway runs it
per request from its snapshot.

Tokens live in `nexus`, which every app depends on, so `nexus` cannot import `pools` to check a
pool slug; `pools` registers its lookup here when it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class TokenKind(StrEnum):
    """What a token is for."""

    CLIENT = "client"  # inference: /v1 and /serve/<name>/
    ADMIN = "admin"  # automation of the admin API, and the metrics


class AdminAccess(StrEnum):
    """How far an admin token reaches into the admin API."""

    READ = "read"  # GET, HEAD, OPTIONS
    WRITE = "write"  # every method


class CalleeKind(StrEnum):
    """What a token may be asked to call."""

    POOL = "pool"  # an operator's pool, `@pool/<slug>`
    SERVICE = "service"  # a model service: `/serve/<name>/` and its managed pool `@pool/<name>`
    ADMIN_API = "admin_api"  # /api/v1/; the name says "read" or "write"
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


ADMIN_API_READ = Callee(CalleeKind.ADMIN_API, AdminAccess.READ)
ADMIN_API_WRITE = Callee(CalleeKind.ADMIN_API, AdminAccess.WRITE)
METRICS = Callee(CalleeKind.METRICS)


def admin_api(*, writes: bool) -> Callee:
    """Return the callee of an admin API call that reads, or one that may change something."""
    return ADMIN_API_WRITE if writes else ADMIN_API_READ


@dataclass(frozen=True, slots=True)
class TokenScope:
    """What a token may reach.

    A client token names every ordinary pool, some pools, and services (a service token); an
    admin token names its access, read or write.
    """

    all_pools: bool
    pools: frozenset[str] = frozenset()
    services: frozenset[str] = frozenset()
    kind: TokenKind = TokenKind.CLIENT
    access: AdminAccess | None = None


def may_call(scope: TokenScope, callee: Callee) -> bool:
    """Say whether a token of this scope may call the callee (validity is checked apart).

    Client tokens call inference only: a pool they name (or every ordinary pool), a service
    only when they name it. Admin tokens never call inference; a read token reads the admin
    API, a write token also changes it; both read the metrics.
    """
    kind = callee.kind
    if scope.kind is TokenKind.CLIENT:
        if kind is CalleeKind.POOL:
            return scope.all_pools or callee.name in scope.pools
        if kind is CalleeKind.SERVICE:
            return callee.name in scope.services
        return False
    if kind is CalleeKind.ADMIN_API:
        return callee.name == AdminAccess.READ or scope.access is AdminAccess.WRITE
    return kind is CalleeKind.METRICS


def refusal(scope: TokenScope, callee: Callee) -> str:
    """Return the message that tells a token's holder why it may not call the callee."""
    kind = callee.kind
    if scope.kind is TokenKind.CLIENT:
        if kind is CalleeKind.ADMIN_API:
            return (
                "A client token calls inference only (/v1 and /serve/<name>/); the admin API "
                "takes a signed-in session or an admin token."
            )
        if kind is CalleeKind.METRICS:
            return "A client token cannot read the metrics; use an admin token."
        return f"This token may not call {kind} {callee.name!r}."
    if kind is CalleeKind.ADMIN_API:
        return "This admin token may only read; changes need an admin token with write access."
    return "An admin token automates the admin API; inference takes a client token."


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
