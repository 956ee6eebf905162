"""Token revocations, in force in every gateway process before the revoking call returns.

A gateway's snapshot follows the database within about a second (the ConfigVersion poll); for
a revoked token that second matters. So a revocation is also announced over Redis: `announce`
publishes the token's hash once the revocation has committed, and waits until every subscribed
gateway process has confirmed that it dropped the token (at most ACK_TIMEOUT_S; one that does
not confirm by then still drops it at its next snapshot). A gateway process subscribes before it
loads its first snapshot, so each revocation is either in that snapshot or announced to it.
Nothing here runs per request: the gateway keeps checking its in-memory snapshot alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import RedisError

from nexus.services import redis_client

log = logging.getLogger(__name__)

# How long a revocation waits for gateway processes to confirm; a confirmation list outlives it
# a little so that a late confirmation does not linger in Redis.
ACK_TIMEOUT_S = 1.5
ACK_TTL_S = 10
# A subscriber that lost Redis tries again after this; meanwhile the snapshot poll covers it.
RECONNECT_DELAY_S = 1.0
SUBSCRIBE_TIMEOUT_S = 1.0


def channel() -> str:
    """Return the Redis channel revocations are announced on."""
    return f"{settings.NEXUS_REDIS_PREFIX}:gateway:revoked"


def announce(token_hash: str) -> int:
    """Drop a revoked token in every gateway process; return how many confirmed it.

    Call it once the revocation has committed (`transaction.on_commit`): a gateway keeps a token
    it was told about out even of snapshots that still hold it, so a revocation that is then
    rolled back must not be announced.
    """
    client = redis_client()
    ack_key = f"{channel()}:ack:{secrets.token_hex(8)}"
    message = json.dumps({"token_hash": token_hash, "ack": ack_key})
    try:
        listeners = client.publish(channel(), message)
        confirmed = 0
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while confirmed < listeners:
            left = deadline - time.monotonic()
            if left <= 0 or client.blpop([ack_key], timeout=left) is None:
                break
            confirmed += 1
        client.delete(ack_key)
    except RedisError:
        log.warning("token revocation not announced (Redis unreachable): gateways drop the token"
                    " at their next snapshot, within about a second")  # fmt: skip
        return 0
    if confirmed < listeners:
        log.warning(
            "%d of %d gateway processes did not confirm a token revocation within %.1f s;"
            " they drop it at their next snapshot",
            listeners - confirmed,
            listeners,
            ACK_TIMEOUT_S,
        )
    return confirmed


class Listener:
    """One gateway process's subscription: `on_revoked(token_hash)` for each announcement."""

    def __init__(self, on_revoked: Callable[[str], None]) -> None:
        self._on_revoked = on_revoked
        # No socket timeout: the subscription waits for messages for as long as it lives.
        self._redis = aioredis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=SUBSCRIBE_TIMEOUT_S
        )
        self._task: asyncio.Task[None] | None = None
        # Whether announcements reach this process now (False while Redis is away).
        self.connected = False

    async def start(self) -> None:
        """Subscribe (waiting for Redis to confirm, about a second at most), then listen."""
        pubsub = self._redis.pubsub()
        subscribed: aioredis.client.PubSub | None = pubsub
        try:
            await asyncio.wait_for(self._subscribe(pubsub), SUBSCRIBE_TIMEOUT_S)
        except (RedisError, OSError, TimeoutError):
            log.warning("revocation announcements unavailable (Redis unreachable)")
            await self._discard(pubsub)
            subscribed = None
        self._task = asyncio.create_task(self._listen_forever(subscribed))

    async def aclose(self) -> None:
        """Stop listening and close the connections."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._redis.aclose()

    @staticmethod
    async def _subscribe(pubsub: aioredis.client.PubSub) -> None:
        await pubsub.subscribe(channel())
        # Redis confirms the subscription: every announcement published after it reaches us.
        while await pubsub.get_message(timeout=SUBSCRIBE_TIMEOUT_S) is None:
            pass

    @staticmethod
    async def _discard(pubsub: aioredis.client.PubSub) -> None:
        # The connection may be broken already; then there is nothing to close cleanly.
        with contextlib.suppress(RedisError, OSError):
            await pubsub.aclose()

    async def _listen_forever(self, pubsub: aioredis.client.PubSub | None) -> None:
        # An outage is logged once when it starts and once when it ends, not at every retry.
        lost = pubsub is None
        self.connected = not lost
        while True:
            try:
                if pubsub is None:
                    pubsub = self._redis.pubsub()
                    await self._subscribe(pubsub)
                    self.connected = True
                    if lost:
                        log.info("revocation announcements available again")
                        lost = False
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                if message is not None and message["type"] == "message":
                    await self._handle(message["data"])
            except (RedisError, OSError, TimeoutError):
                self.connected = False
                if not lost:
                    log.warning("revocation announcements interrupted (Redis unreachable)")
                    lost = True
                if pubsub is not None:
                    await self._discard(pubsub)
                    pubsub = None
                await asyncio.sleep(RECONNECT_DELAY_S)

    async def _handle(self, data: bytes) -> None:
        """Drop the announced token, then confirm to the announcer."""
        try:
            announcement = json.loads(data)
            token_hash, ack_key = announcement["token_hash"], announcement["ack"]
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed revocation announcement")
            return
        self._on_revoked(token_hash)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.rpush(ack_key, 1)
            pipe.expire(ack_key, ACK_TTL_S)
            await pipe.execute()
