"""Keep each gateway process's snapshot fresh, off the request path."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from nexus.graceful import stop_part
from nexus.models import ApiToken
from pools.gateway.revocations import Listener
from pools.gateway.snapshot import (
    EMPTY,
    Snapshot,
    TokenEntry,
    current_version,
    load_snapshot,
    load_token,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# A token unknown to the snapshot may have been issued since it was read (it shows up within
# about a second): it is looked up once. Lookups are bounded per second across all secrets, so
# a flood of made-up tokens cannot reach the database more than this; a secret found unknown is
# remembered (a bounded number of them) and answered from memory for a while.
TOKEN_LOOKUPS_PER_S = 20
UNKNOWN_TOKEN_TTL_S = 60.0
UNKNOWN_TOKENS_KEPT = 10_000


def _touch_tokens(token_ids: list[int]) -> None:
    ApiToken.objects.filter(pk__in=token_ids).update(last_used_at=timezone.now())


def _guarded(function: Callable[..., T], *args: Any) -> T:
    try:
        return function(*args)
    except Exception:
        # A dropped database connection must not stick: the next call reconnects.
        close_old_connections()
        raise


class Registry:
    """The current snapshot, checked against the configuration version about once a second.

    Token revocations announced over Redis (pools.gateway.revocations) take effect at once,
    between snapshots.
    """

    def __init__(self, refresh_interval_s: float = 1.0, usage_flush_interval_s: float = 30.0):
        self.snapshot: Snapshot = EMPTY
        self.refresh_interval_s = refresh_interval_s
        self.usage_flush_interval_s = usage_flush_interval_s
        self._used_tokens: set[int] = set()
        # Revocations announced to this process that a snapshot read before they committed may
        # still hold: each new snapshot is cleaned of them, until one lacks them.
        self._revoked: set[str] = set()
        self._first_load: asyncio.Future[None] | None = None
        # Token lookups on a snapshot miss: in flight by hash, unknown hashes until when, and
        # this second's lookup count.
        self._lookups: dict[str, asyncio.Future[TokenEntry | None]] = {}
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self._lookup_second = 0
        self._lookups_this_second = 0
        self._refresher: asyncio.Task[None] | None = None
        self._listener: Listener | None = None

    async def ready(self) -> Snapshot:
        """Return the snapshot, loading it on the process's first request."""
        if self.snapshot is not EMPTY:
            return self.snapshot
        # One load for every request that arrives before it is done, and all of them resume
        # together when it is: a lock would hand the snapshot on one waiter per loop turn.
        if self._first_load is None or (
            self._first_load.done() and self._first_load.exception() is not None
        ):
            self._first_load = asyncio.ensure_future(self._load_first())
        await asyncio.shield(self._first_load)
        return self.snapshot

    async def _load_first(self) -> None:
        # Listening first: a revocation is then either announced or in the snapshot.
        if self._listener is None:
            self._listener = Listener(self.revoke)
            await self._listener.start()
        self._install(await sync_to_async(_guarded)(load_snapshot))
        self._refresher = asyncio.create_task(self._refresh_forever())

    async def aclose(self) -> None:
        """Stop refreshing and listening, and write the pending token usage."""
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        if self._listener is not None:
            await stop_part(self._listener.aclose(), "revocation listener")
            self._listener = None
        await self.flush_token_usage()

    def revocations_announced(self) -> bool:
        """Say whether revocations reach this process at once (over Redis) rather than with the
        next configuration poll."""
        return self._listener is not None and self._listener.connected

    def revoke(self, token_hash: str) -> None:
        """Stop a revoked token now, before any snapshot shows it revoked."""
        # Kept even when the current snapshot lacks the token: one being read may hold it.
        self._revoked.add(token_hash)
        if self.snapshot is not EMPTY:
            self.snapshot.tokens.pop(token_hash, None)
            self.snapshot.revoked.add(token_hash)

    def _install(self, snapshot: Snapshot) -> None:
        """Make the snapshot current, without the tokens revoked since it was read."""
        held: set[str] = set()
        for token_hash in self._revoked:
            if snapshot.tokens.pop(token_hash, None) is not None:
                held.add(token_hash)
            snapshot.revoked.add(token_hash)
        # A snapshot without the token was read after the revocation committed: later ones
        # cannot hold it either.
        self._revoked = held
        self.snapshot = snapshot

    async def look_up_token(self, token_hash: str) -> TokenEntry | None:
        """Return a usable token the snapshot does not hold yet, or None for an unknown one.

        Off the event loop, one query per secret however many requests bring it at once, at
        most TOKEN_LOOKUPS_PER_S a second; past that, or while the secret is remembered as
        unknown, the answer is None without a query.
        """
        now = time.monotonic()
        if self._unknown.get(token_hash, 0.0) > now:
            return None
        pending = self._lookups.get(token_hash)
        if pending is None:
            second = int(now)
            if second != self._lookup_second:
                self._lookup_second, self._lookups_this_second = second, 0
            if self._lookups_this_second >= TOKEN_LOOKUPS_PER_S:
                return None
            self._lookups_this_second += 1
            pending = asyncio.ensure_future(sync_to_async(_guarded)(load_token, token_hash))
            self._lookups[token_hash] = pending
            pending.add_done_callback(lambda _: self._lookups.pop(token_hash, None))
        try:
            # Shielded: one caller's disconnect must not cancel the lookup the others await.
            entry = await asyncio.shield(pending)
        except Exception:
            log.exception("token lookup failed; answering as for an unknown token")
            return None
        if entry is None:
            self._unknown[token_hash] = time.monotonic() + UNKNOWN_TOKEN_TTL_S
            self._unknown.move_to_end(token_hash)
            while len(self._unknown) > UNKNOWN_TOKENS_KEPT:
                self._unknown.popitem(last=False)
            return None
        if token_hash in self._revoked:
            return None
        self.snapshot.tokens[token_hash] = entry
        return entry

    def note_token_used(self, token_id: int) -> None:
        self._used_tokens.add(token_id)

    async def refresh(self) -> None:
        """Reload the snapshot if the configuration changed since it was built."""
        version = await sync_to_async(_guarded)(current_version)
        if version != self.snapshot.version:
            self._install(await sync_to_async(_guarded)(load_snapshot))

    async def flush_token_usage(self) -> None:
        if not self._used_tokens:
            return
        used, self._used_tokens = sorted(self._used_tokens), set()
        await sync_to_async(_guarded)(_touch_tokens, used)

    async def _refresh_forever(self) -> None:
        last_flush = time.monotonic()
        while True:
            await asyncio.sleep(self.refresh_interval_s)
            try:
                await self.refresh()
                if time.monotonic() - last_flush >= self.usage_flush_interval_s:
                    last_flush = time.monotonic()
                    await self.flush_token_usage()
            except Exception:
                log.exception("gateway snapshot refresh failed; keeping the previous snapshot")
