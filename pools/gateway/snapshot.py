"""The gateway's in-memory view of pools, targets, services and tokens, rebuilt on changes."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from nexus import scopes
from nexus.models import ApiToken, ConfigVersion
from pools.balancer.limits import NO_LIMITS, TokenLimits
from pools.balancer.snapshot import DrainState, Health, PoolPolicy, TargetView
from pools.models import Pool, Target, node_base_url

# A target that served a request this recently counts as warm (its model is loaded).
WARM_WINDOW_S = 300.0
# The request kind of /serve/<service>/...: any HTTP request, which every replica of a service
# takes (a gateway-only kind: a managed pool's targets get it in the snapshot, not in the database).
SERVE_KIND = "http"


@dataclass(frozen=True, slots=True)
class ServiceEntry:
    """The live model service that owns a managed pool."""

    name: str
    open_to_public: bool
    desired_replicas: int
    # Scaled to zero and woken by a request: it waits in the pool queue while a replica starts.
    sleeping: bool = False


@dataclass(frozen=True, slots=True)
class TokenEntry:
    id: int
    name: str
    scope: scopes.TokenScope
    expires_at: float | None  # epoch seconds
    limits: TokenLimits = NO_LIMITS

    def may_use(self, pool: PoolEntry) -> bool:
        """Say whether the token may call the pool (a service's pool: the service)."""
        return pool.callee is not None and scopes.may_call(self.scope, pool.callee)


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
    health: Health = Health.HEALTHY  # the active probes' verdict (a service's replicas)
    # Reached through a node's agent, whose "not delivered" answers are trusted (see flight).
    on_node: bool = False

    def view(
        self,
        *,
        circuit_open: bool,
        circuit_detail: str,
        in_flight: int,
        engine_running: int | None,
        engine_waiting: int | None,
        engine_counted: int | None,
        ttft_s: float | None,
        tpot_s: float | None,
        error_rate: float,
        warm: bool,
        service_s: float | None = None,
    ) -> TargetView:
        """Return the target as the balancer sees it, given its live readings."""
        return TargetView(
            id=self.id,
            name=self.name,
            priority=self.priority,
            capacity=self.capacity,
            position=self.position,
            kinds=self.kinds,
            model_id=self.model_id,
            enabled=self.enabled,
            drain=self.drain,
            health=self.health,
            unavailable=self.unavailable,
            circuit_open=circuit_open,
            circuit_detail=circuit_detail,
            in_flight=in_flight,
            engine_running=engine_running,
            engine_waiting=engine_waiting,
            engine_counted=engine_counted,
            ttft_s=ttft_s,
            tpot_s=tpot_s,
            service_s=service_s,
            error_rate=error_rate,
            warm=warm,
        )


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """How long a pool's targets may stay silent before the attempt fails as their fault."""

    first_byte_s: float = 60.0  # a streamed answer's response headers, from the request sent
    first_token_s: float = 120.0  # the first chunk of the body, from the request sent
    stream_idle_s: float = 60.0  # between two chunks


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
    timeouts: UpstreamTimeouts = field(default_factory=UpstreamTimeouts)
    managed: bool = False  # a model service's pool: its targets are the service's replicas
    service: ServiceEntry | None = None  # the live service owning a managed pool
    # What a token must be allowed to call to use the pool: the pool, or for a managed pool its
    # service (None while it has no live service: nobody may call it).
    callee: scopes.Callee | None = None
    _by_id: dict[int, TargetEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {target.id: target for target in self.targets})

    def target(self, target_id: int) -> TargetEntry:
        """Return the pool's target with this id."""
        return self._by_id[target_id]

    @property
    def label(self) -> str:
        """Name the pool in error messages: a service's pool by its service."""
        if self.service is not None:
            return f"Service '{self.service.name}'"
        return f"Pool '{self.slug}'"


@dataclass(frozen=True, slots=True)
class Snapshot:
    version: int
    tokens: dict[str, TokenEntry]  # usable tokens by hash
    pools: dict[str, PoolEntry]  # by slug, managed ones too
    services: dict[str, PoolEntry] = field(default_factory=dict)  # live services' pools by name
    # Hashes of revoked tokens, to tell a revoked token from an unknown one.
    revoked: set[str] = field(default_factory=set)


EMPTY = Snapshot(version=-1, tokens={}, pools={})


# Request kind -> path below a target's OpenAI-compatible base URL.
KIND_PATHS = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
}


def _target_entry(target: Target, managed: bool) -> TargetEntry:
    node = target.node
    credential = target.upstream_credential()
    if node is None or managed:
        # A replica's URL is its own root (`<node>/agent/v1/processes/<id>/http` on a node),
        # kept in step by its service; its OpenAI API is below /v1.
        base_url = target.base_url.rstrip("/")
    else:
        base_url = node_base_url(node.address)
    api_url = base_url + "/v1" if managed else base_url
    # A node's targets are reached through its agent, and only while the node is trusted and
    # online; a target the operator disabled is out for that reason alone.
    unavailable = node.unusable_reason() if node is not None and target.enabled else ""
    kinds = frozenset(target.kinds)
    return TargetEntry(
        id=target.pk,
        name=target.name,
        base_url=base_url,
        model_id=target.model_id,
        kinds=kinds | {SERVE_KIND} if managed else kinds,
        authorization=f"Bearer {credential}" if credential else None,
        urls={kind: httpx.URL(api_url + path) for kind, path in KIND_PATHS.items()},
        priority=target.priority,
        capacity=target.capacity_weight,
        position=target.position,
        enabled=target.enabled and not unavailable,
        drain=DrainState(target.state),
        unavailable=unavailable,
        health=Health(target.health),
        on_node=node is not None,
    )


def _service_entry(pool: Pool) -> ServiceEntry | None:
    """Return the live service owning a managed pool; None for any other pool.

    Pools know services only through this reverse relation (the pool's `service`); a service
    being destroyed or destroyed takes no more traffic.
    """
    service = getattr(pool, "service", None) if pool.managed else None
    if service is None or service.lifecycle != "active":
        return None
    return ServiceEntry(
        name=service.name,
        open_to_public=service.open_to_public,
        desired_replicas=service.desired_replicas,
        sleeping=service.desired_replicas == 0 and service.scale_to_zero_after_s is not None,
    )


def pool_entry(pool: Pool) -> PoolEntry:
    """Return a pool as the gateway routes by it (its targets and service prefetched, ideally)."""
    targets = tuple(
        _target_entry(target, pool.managed)
        for target in sorted(pool.targets.all(), key=lambda t: (t.priority, t.position, t.pk))
    )
    service = _service_entry(pool)
    if not pool.managed:
        callee: scopes.Callee | None = scopes.pool(pool.slug)
    else:
        callee = scopes.service(service.name) if service is not None else None
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
            max_ejected_share=pool.max_ejection_percent / 100,
        ),
        max_queue=pool.max_queue,
        max_queue_wait_s=pool.max_queue_wait_s,
        max_attempts=pool.max_attempts,
        timeouts=UpstreamTimeouts(
            first_byte_s=pool.first_byte_timeout_s,
            first_token_s=pool.first_token_timeout_s,
            stream_idle_s=pool.stream_idle_timeout_s,
        ),
        managed=pool.managed,
        service=service,
        callee=callee,
    )


def token_entry(token: ApiToken) -> TokenEntry:
    """Return what the gateway keeps of a token."""
    return TokenEntry(
        id=token.pk,
        name=token.name,
        scope=token.scope,
        expires_at=token.expires_at.timestamp() if token.expires_at else None,
        limits=TokenLimits(
            requests_per_minute=token.requests_per_minute,
            tokens_per_minute=token.tokens_per_minute,
            concurrent=token.max_concurrent,
        ),
    )


def load_token(token_hash: str) -> TokenEntry | None:
    """Read one token that is not revoked (one query), for a token newer than the snapshot."""
    token = ApiToken.objects.filter(token_hash=token_hash, revoked_at__isnull=True).first()
    return token_entry(token) if token is not None else None


def load_snapshot() -> Snapshot:
    """Read the configuration the gateway routes by (a handful of queries, off the hot path)."""
    version = ConfigVersion.current()
    tokens = {
        token.token_hash: token_entry(token)
        for token in ApiToken.objects.filter(revoked_at__isnull=True)
    }
    revoked = set(
        ApiToken.objects.filter(revoked_at__isnull=False).values_list("token_hash", flat=True)
    )
    pools = {
        pool.slug: pool_entry(pool)
        for pool in Pool.objects.select_related("service").prefetch_related(
            "targets", "targets__node"
        )
    }
    services = {pool.service.name: pool for pool in pools.values() if pool.service is not None}
    return Snapshot(version=version, tokens=tokens, pools=pools, services=services, revoked=revoked)


def current_version() -> int:
    return ConfigVersion.current()
