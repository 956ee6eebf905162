"""What is live: pushes to the pools pages, and the gateways' published state.

`pools_changed` pushes the pools table through nexus.live, the one typed gateway to the pages,
to staff's pages only: everyone else's table holds only their projects' pools, and a push is
rendered once for all who get it. Their pages open no socket; they refresh on request.
`live_state` reads what every gateway process published (pools.gateway.publish) and merges it,
so that any process (the admin API's dry run, the Live and pool pages) sees the balancer's view.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from redis.exceptions import RedisError

from nexus import live
from nexus.services import redis_client, redis_text
from pools.balancer.health import CircuitReport
from pools.balancer.snapshot import TargetView
from pools.gateway import publish
from pools.gateway.engine_metrics import STALE_AFTER_S
from pools.gateway.ledger import COUNT_LUA, lease_set_key
from pools.gateway.publish import GatewayReadings, TargetReading
from pools.gateway.snapshot import WARM_WINDOW_S, TargetEntry
from pools.views import POOLS_TABLE, pools_table_context, with_targets

logger = logging.getLogger(__name__)

# How long a dry run waits for the gateway processes to say where a conversation went.
ASK_TIMEOUT_S = 0.5

POOLS_TOPIC = "pools"
# The only audience pools pages are pushed to (see the module's docstring).
STAFF: live.Audience = "manage"


def pools_table() -> str:
    """Return the pools table as staff see it now (every pool), rendered for a push."""
    return live.fragment(POOLS_TABLE, pools_table_context(with_targets(), STAFF))


def pools_changed() -> None:
    """Push the current pools table to staff's open pools pages (nexus.live has the pattern)."""
    live.push(POOLS_TOPIC, "pools-table", pools_table(), audience=STAFF)


# -- the gateways' live state, read from any process --------------------------------------------


@dataclass(frozen=True, slots=True)
class LiveState:
    """What every live gateway process published, merged: the balancer's view from anywhere.

    Merged per target: in-flight counts from the Redis ledger when the gateways share it, else
    the sum of each process's own; a circuit counts as open when it is open in any process
    (with that process's cause and the latest trial time); latency averaged, the error rate
    the highest, the last service and the engine reading the most recent. Queues add up; a
    pool's round-robin turn is the most recently published one.
    """

    # The live gateway processes merged; none when nothing routes or Redis is away.
    processes: tuple[str, ...]
    read_at: float  # epoch seconds
    targets: dict[int, TargetReading] = field(default_factory=dict)
    queued: dict[int, int] = field(default_factory=dict)
    turns: dict[int, int] = field(default_factory=dict)

    @property
    def gateways(self) -> int:
        return len(self.processes)

    def view(self, target: TargetEntry) -> TargetView:
        """Return the target as a gateway's balancer would see it now."""
        reading = self.targets.get(target.id) or TargetReading(in_flight=0)
        now = self.read_at
        fresh = reading.engine_read_at is not None and now - reading.engine_read_at <= (
            STALE_AFTER_S
        )
        served = reading.last_served_at
        return target.view(
            circuit_open=reading.circuit is not None,
            circuit_detail=reading.circuit.detail if reading.circuit is not None else "",
            in_flight=reading.in_flight,
            engine_running=reading.engine_running if fresh else None,
            engine_waiting=reading.engine_waiting if fresh else None,
            engine_counted=reading.engine_counted if fresh else None,
            ttft_s=reading.ttft_s,
            tpot_s=reading.tpot_s,
            error_rate=reading.error_rate,
            warm=served is not None and now - served < WARM_WINDOW_S,
        )


def gateway_readings() -> list[GatewayReadings]:
    """Return the readings of every live gateway process; none when Redis is unreachable."""
    prefix = settings.NEXUS_REDIS_PREFIX
    client = redis_client()
    try:
        processes = [
            redis_text(process)
            for process in client.zrangebyscore(publish.index_key(prefix), time.time(), "+inf")
        ]
        documents = (
            client.mget([publish.reading_key(prefix, process) for process in processes])
            if processes
            else []
        )
    except RedisError:
        logger.warning("gateway live state unavailable (Redis unreachable)")
        return []
    readings = []
    for document in documents:
        if document is None:
            continue  # expired since the index was read
        try:
            readings.append(publish.decode(document))
        except ValueError:
            logger.warning("ignoring a malformed gateway live-state reading")
    return readings


def live_state(target_ids: Collection[int]) -> LiveState:
    """Return the merged live state of these targets, as every gateway process published it."""
    readings = gateway_readings()
    shared = None
    if any(reading.shared_ledger for reading in readings):
        shared = _shared_counts(target_ids)
    return merge(readings, time.time(), target_ids, shared)


def merge(
    readings: Sequence[GatewayReadings],
    now: float,
    target_ids: Collection[int],
    shared_counts: Mapping[int, int] | None = None,
) -> LiveState:
    """Merge processes' readings of these targets into one view (see LiveState)."""
    targets = {}
    for target_id in target_ids:
        seen = [
            (reading, found)
            for reading in readings
            if (found := reading.targets.get(target_id)) is not None
        ]
        if shared_counts is not None:
            in_flight = shared_counts.get(target_id, 0)
        else:
            in_flight = sum(found.in_flight for _, found in seen)
        if not seen:
            targets[target_id] = TargetReading(in_flight=in_flight)
            continue
        ttfts = [found.ttft_s for _, found in seen if found.ttft_s is not None]
        tpots = [found.tpot_s for _, found in seen if found.tpot_s is not None]
        served = [found.last_served_at for _, found in seen if found.last_served_at is not None]
        engine = max(
            (found for _, found in seen if found.engine_read_at is not None),
            key=lambda found: found.engine_read_at or 0.0,
            default=None,
        )
        targets[target_id] = TargetReading(
            in_flight=in_flight,
            circuit=_open_circuit(
                [(now - reading.published_at, found.circuit) for reading, found in seen]
            ),
            ttft_s=sum(ttfts) / len(ttfts) if ttfts else None,
            tpot_s=sum(tpots) / len(tpots) if tpots else None,
            error_rate=max(found.error_rate for _, found in seen),
            last_served_at=max(served) if served else None,
            engine_running=engine.engine_running if engine else None,
            engine_waiting=engine.engine_waiting if engine else None,
            engine_read_at=engine.engine_read_at if engine else None,
            # What that process counted at the reading is comparable with the merged in-flight
            # count only when both are the shared ledger's, or it is the only process: else
            # other gateways' requests would count twice (None: the engine's count is taken
            # as including the current one, the balancer's rule when it is unknown).
            engine_counted=engine.engine_counted
            if engine and (shared_counts is not None or len(seen) == 1)
            else None,
        )
    queued: dict[int, int] = {}
    turns: dict[int, int] = {}
    for reading in sorted(readings, key=lambda reading: reading.published_at):
        for pool_id, waiting in reading.queued.items():
            queued[pool_id] = queued.get(pool_id, 0) + waiting
        turns.update(reading.turns)
    return LiveState(
        processes=tuple(reading.process for reading in readings),
        read_at=now,
        targets=targets,
        queued=queued,
        turns=turns,
    )


def _open_circuit(circuits: Sequence[tuple[float, CircuitReport | None]]) -> CircuitReport | None:
    """Return the circuit still open now in any process, aged by its reading's age.

    A probe's hold comes first, then the latest half-open trial; a cooldown that ended since
    its reading is half-open now, and lets a request through.
    """
    still_open = []
    for age, circuit in circuits:
        if circuit is None:
            continue
        if circuit.trial_in_s is not None:
            left = circuit.trial_in_s - age
            if left <= 0:
                continue
            circuit = CircuitReport(cause=circuit.cause, trial_in_s=left)
        still_open.append(circuit)
    if not still_open:
        return None
    return max(
        still_open,
        key=lambda c: (c.probe_failing, c.trial_in_s is None, c.trial_in_s or 0.0),
    )


def _shared_counts(target_ids: Collection[int]) -> dict[int, int]:
    """Return the Redis ledger's in-flight counts of these targets (0 when Redis is away)."""
    ids = list(target_ids)
    if not ids:
        return {}
    client = redis_client()
    count = client.register_script(COUNT_LUA)
    prefix = settings.NEXUS_REDIS_PREFIX
    try:
        pipe = client.pipeline(transaction=False)
        for target_id in ids:
            count(keys=[lease_set_key(prefix, target_id)], client=pipe)
        answers = pipe.execute()
    except RedisError:
        logger.warning("load ledger counts unavailable (Redis unreachable)")
        return {}
    return {target_id: int(live) for target_id, (live, _) in zip(ids, answers, strict=True)}


def ask_affinity(
    processes: Sequence[str], session_key: str | None, prefix_key: str | None
) -> tuple[int | None, int | None]:
    """Ask the live gateway processes where a conversation and a prompt prefix went last.

    Each process remembers its own; the first that knows answers for it. Waits at most
    ASK_TIMEOUT_S for processes that do not answer (busy, or gone since they published).
    """
    if not processes or (session_key is None and prefix_key is None):
        return None, None
    client = redis_client()
    prefix = settings.NEXUS_REDIS_PREFIX
    reply = f"{publish.index_key(prefix)}:reply:{secrets.token_hex(8)}"
    question = json.dumps({"s": session_key, "x": prefix_key, "r": reply})
    sticky = prefixed = None
    try:
        pipe = client.pipeline(transaction=False)
        for process in processes:
            key = publish.question_key(prefix, process)
            pipe.rpush(key, question)
            pipe.expire(key, publish.REPLY_TTL_S)
        pipe.execute()
        deadline = time.monotonic() + ASK_TIMEOUT_S
        for _ in processes:
            left = deadline - time.monotonic()
            answer = client.blpop([reply], timeout=left) if left > 0 else None
            if answer is None:
                break
            known = json.loads(answer[1])
            sticky = sticky if sticky is not None else known["s"]
            prefixed = prefixed if prefixed is not None else known["x"]
        client.delete(reply)
    except RedisError:
        logger.warning("gateway affinity unavailable (Redis unreachable)")
    return sticky, prefixed
