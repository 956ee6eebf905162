"""Conversation continuity: which key a request carries, and where that key went last.

Keys are hashed here, before anything stores them: the affinity map, history and logs only ever
see a 32-hex-digit digest, never a session id, a user name or prompt text.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

# Explicit keys, strongest first (DESIGN.md "Continuity"). Header names are lowercase.
SESSION_HEADERS = ("x-nexus-session-id", "x-msty-nexus-session-id")
BODY_KEYS = ("prompt_cache_key", "user")
# Chat: each leading message counts up to this many characters of its JSON. A long document in
# the first message then costs a bounded hash, and two chats that differ only beyond it share an
# engine's prefix cache anyway.
MESSAGE_CHARS = 4096
# Completions: the first characters (or token ids) of the prompt. Shorter prompts get no
# fingerprint: their next turn (prompt + answer + more) would hash differently, and a short
# prefix saves the engine little.
PROMPT_CHARS = 1024
PROMPT_TOKENS = 256


def _digest(*parts: str) -> str:
    # surrogatepass: JSON may carry lone surrogates ("\ud800"), which strict UTF-8 refuses.
    material = "\x1f".join(parts).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(material, digest_size=16).hexdigest()


def _text(value: object) -> str | None:
    if isinstance(value, str):
        value = value.strip()
        if value:
            return value
    return None


def continuity_key(
    pool_slug: str, headers: Mapping[str, str], body: Mapping[str, Any]
) -> str | None:
    """Return the hashed conversation key of a request, or None when it carries none."""
    # Both headers name the same thing, a session, so they share a namespace; the body's keys
    # get their own, so a session "42" and a user "42" stay different conversations.
    for name in SESSION_HEADERS:
        if (value := _text(headers.get(name))) is not None:
            return _digest("session", pool_slug, value)
    for name in BODY_KEYS:
        if (value := _text(body.get(name))) is not None:
            return _digest(name, pool_slug, value)
    return None


def continuity_keys(
    pool_slug: str, enabled: bool, kind: str, headers: Mapping[str, str], body: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """Return a request's conversation key and prompt-prefix fingerprint; None for each it lacks.

    Both are None when the pool's continuity is off.
    """
    if not enabled:
        return None, None
    return continuity_key(pool_slug, headers, body), prefix_fingerprint(pool_slug, body, kind)


def prefix_fingerprint(pool_slug: str, body: Mapping[str, Any], kind: str) -> str | None:
    """Return a hash of the request's leading prompt, the implicit affinity key, or None.

    chat: every message up to and including the first user message (the system or developer
    prompt and the opening question), by role and content; each message counts up to
    MESSAGE_CHARS characters of its JSON. Later turns repeat these messages unchanged, so a
    conversation keeps one fingerprint. No user message, no fingerprint.
    completions: the first PROMPT_CHARS characters of a string prompt (or of a one-string
    list), or the first PROMPT_TOKENS ids of a token prompt; shorter prompts and batches get
    none.
    Anything else (embeddings): none; there is no conversation to continue.
    """
    if kind == "chat":
        return _chat_fingerprint(pool_slug, body.get("messages"))
    if kind == "completions":
        return _prompt_fingerprint(pool_slug, body.get("prompt"))
    return None


def _chat_fingerprint(pool_slug: str, messages: object) -> str | None:
    if not isinstance(messages, list):
        return None
    leading: list[str] = []
    for message in messages:
        if not isinstance(message, Mapping):
            return None
        role = message.get("role")
        # default=str: a body built in code (not parsed JSON) must not break routing.
        encoded = json.dumps(
            [role, message.get("content")],
            ensure_ascii=False,
            sort_keys=True,
            separators=(",", ":"),
            default=str,
        )
        leading.append(encoded[:MESSAGE_CHARS])
        if role == "user":
            return _digest("chat", pool_slug, *leading)
    return None


def _prompt_fingerprint(pool_slug: str, prompt: object) -> str | None:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if len(prompt) < PROMPT_CHARS:
            return None
        return _digest("prompt", pool_slug, prompt[:PROMPT_CHARS])
    if (
        isinstance(prompt, list)
        and len(prompt) >= PROMPT_TOKENS
        and all(type(token) is int for token in prompt[:PROMPT_TOKENS])
    ):
        return _digest("tokens", pool_slug, ",".join(map(str, prompt[:PROMPT_TOKENS])))
    return None


class AffinityMap:
    """Remember which target each hashed key went to last: bounded, least recently routed out."""

    __slots__ = ("max_entries", "ttl_s", "_entries")

    def __init__(self, max_entries: int = 100_000, ttl_s: float = 1800.0) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, not {ttl_s}")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        # key -> (target id, when it was last routed). Kept in routing order, oldest first:
        # only `put` reorders, so the front is both least recent and first to expire.
        self._entries: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> int | None:
        """Return the target this key went to last, or None if unknown or expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        target_id, routed_at = entry
        if now - routed_at >= self.ttl_s:
            del self._entries[key]
            return None
        return target_id

    def put(self, key: str, target_id: int, now: float) -> None:
        """Record that this key was just routed to the target."""
        self._entries[key] = (target_id, now)
        self._entries.move_to_end(key)
        # Expired entries sit at the front; dropping them here keeps the map from holding dead
        # conversations until the size bound pushes them out.
        while self._entries:
            _, (_, routed_at) = next(iter(self._entries.items()))
            if now - routed_at < self.ttl_s and len(self._entries) <= self.max_entries:
                break
            self._entries.popitem(last=False)

    def forget_target(self, target_id: int) -> int:
        """Drop every key that points at the target (drained or removed); return how many."""
        stale = [key for key, (target, _) in self._entries.items() if target == target_id]
        for key in stale:
            del self._entries[key]
        return len(stale)
