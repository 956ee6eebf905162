"""One rule says what a token may call; the ORM token and the gateway's snapshot both ask it."""

from __future__ import annotations

import pytest

from nexus import scopes
from nexus.models import ApiToken
from nexus.scopes import (
    ADMIN_API_READ,
    ADMIN_API_WRITE,
    METRICS,
    AdminAccess,
    TokenKind,
    TokenScope,
    may_call,
)
from pools.gateway.snapshot import load_snapshot
from pools.models import Pool
from serving.models import Service
from tests.nexus.factories import make_pool

ALL_POOLS = TokenScope(all_pools=True)
CHAT_ONLY = TokenScope(all_pools=False, pools=frozenset({"chat"}))
SERVICE = TokenScope(all_pools=False, services=frozenset({"svc"}))
BOTH = TokenScope(all_pools=False, pools=frozenset({"chat"}), services=frozenset({"svc"}))
ADMIN_READ = TokenScope(all_pools=False, kind=TokenKind.ADMIN, access=AdminAccess.READ)
ADMIN_WRITE = TokenScope(all_pools=False, kind=TokenKind.ADMIN, access=AdminAccess.WRITE)

# (who, scope, callee, may call)
CASES = [
    ("all pools", ALL_POOLS, scopes.pool("chat"), True),
    ("all pools", ALL_POOLS, scopes.pool("other"), True),
    ("all pools", ALL_POOLS, scopes.service("svc"), False),
    ("all pools", ALL_POOLS, ADMIN_API_READ, False),
    ("all pools", ALL_POOLS, ADMIN_API_WRITE, False),
    ("all pools", ALL_POOLS, METRICS, False),
    ("chat only", CHAT_ONLY, scopes.pool("chat"), True),
    ("chat only", CHAT_ONLY, scopes.pool("other"), False),
    ("chat only", CHAT_ONLY, scopes.service("svc"), False),
    ("chat only", CHAT_ONLY, ADMIN_API_READ, False),
    ("chat only", CHAT_ONLY, METRICS, False),
    ("service token", SERVICE, scopes.pool("chat"), False),
    ("service token", SERVICE, scopes.service("svc"), True),
    ("service token", SERVICE, scopes.service("other"), False),
    ("service token", SERVICE, ADMIN_API_READ, False),
    ("service token", SERVICE, METRICS, False),
    ("pools and a service", BOTH, scopes.pool("chat"), True),
    ("pools and a service", BOTH, scopes.service("svc"), True),
    ("pools and a service", BOTH, ADMIN_API_READ, False),
    ("pools and a service", BOTH, METRICS, False),
    ("admin read", ADMIN_READ, scopes.pool("chat"), False),
    ("admin read", ADMIN_READ, scopes.service("svc"), False),
    ("admin read", ADMIN_READ, ADMIN_API_READ, True),
    ("admin read", ADMIN_READ, ADMIN_API_WRITE, False),
    ("admin read", ADMIN_READ, METRICS, True),
    ("admin write", ADMIN_WRITE, scopes.pool("chat"), False),
    ("admin write", ADMIN_WRITE, scopes.service("svc"), False),
    ("admin write", ADMIN_WRITE, ADMIN_API_READ, True),
    ("admin write", ADMIN_WRITE, ADMIN_API_WRITE, True),
    ("admin write", ADMIN_WRITE, METRICS, True),
]


@pytest.mark.parametrize(
    ("scope", "callee", "allowed"),
    [
        pytest.param(scope, callee, allowed, id=f"{who}-{callee.kind}-{callee.name or '-'}")
        for who, scope, callee, allowed in CASES
    ],
)
def test_may_call_follows_the_table(
    scope: TokenScope, callee: scopes.Callee, allowed: bool
) -> None:
    assert may_call(scope, callee) is allowed


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("pools", "services", "kind"),
    [
        ((), (), TokenKind.CLIENT),
        (("chat",), (), TokenKind.CLIENT),
        ((), ("svc",), TokenKind.CLIENT),
        (("chat",), ("svc",), TokenKind.CLIENT),
        ((), (), TokenKind.ADMIN),
    ],
    ids=["all pools", "chat only", "service token", "pools and a service", "admin"],
)
def test_the_token_and_its_snapshot_entry_answer_as_the_rule(
    pools: tuple[str, ...], services: tuple[str, ...], kind: TokenKind
) -> None:
    # Given an ordinary pool, another one, and a service's pool, and a token of this scope,
    make_pool("chat")
    make_pool("other")
    managed = Pool.objects.create(slug="svc", name="svc", managed=True)
    Service.objects.create(name="svc", pool=managed)
    token, _ = ApiToken.issue("t", kind=kind, pools=list(pools), services=list(services))

    # when the ORM token and the gateway's snapshot entry are asked about each of them,
    snapshot = load_snapshot()
    entry = snapshot.tokens[token.token_hash]
    callees = {
        "chat": scopes.pool("chat"),
        "other": scopes.pool("other"),
        "svc": scopes.service("svc"),
    }

    # then both say what the rule says.
    for slug, callee in callees.items():
        expected = may_call(token.scope, callee)
        assert token.may_call(callee) is expected, slug
        assert entry.may_use(snapshot.pools[slug]) is expected, slug


@pytest.mark.django_db
def test_nobody_may_call_the_pool_of_a_service_being_destroyed() -> None:
    managed = Pool.objects.create(slug="svc", name="svc", managed=True)
    Service.objects.create(name="svc", pool=managed, lifecycle="destroying")
    token, _ = ApiToken.issue("t", services=["svc"])

    snapshot = load_snapshot()

    assert snapshot.tokens[token.token_hash].may_use(snapshot.pools["svc"]) is False
