"""What a client token may be scoped to. The app that owns those things says which exist.

Tokens live in `nexus`, which every app depends on, so `nexus` cannot import `pools` to check a
pool slug; `pools` registers its lookup here when it starts.
"""

from __future__ import annotations

from collections.abc import Callable

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
