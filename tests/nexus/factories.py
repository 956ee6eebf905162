"""Typed factories for the people and objects the tests talk about."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User

from pools.models import Pool, Target


def make_user(
    username: str, *, staff: bool = False, superuser: bool = False, password: str | None = None
) -> User:
    """Create a user; without a password (hashing is slow) tests sign them in with force_login."""
    return User.objects.create_user(
        username, password=password, is_staff=staff or superuser, is_superuser=superuser
    )


def make_pool(slug: str, **fields: Any) -> Pool:
    """Create a pool named after its slug."""
    return Pool.objects.create(slug=slug, name=fields.pop("name", slug.title()), **fields)


def make_target(pool: Pool, name: str, *, credential: str = "", **fields: Any) -> Target:
    """Create a target in the pool, with a credential when one is given."""
    target = Target(
        pool=pool,
        name=name,
        base_url=fields.pop("base_url", f"http://{name}.lan:8000/v1"),
        model_id=fields.pop("model_id", "llama-3.1-8b"),
        **fields,
    )
    target.set_credential(credential)
    target.save()
    return target
