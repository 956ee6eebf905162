"""Continuity keys, prefix fingerprints and the affinity map."""

from __future__ import annotations

import hashlib
import json

import pytest

from pools.balancer.continuity import (
    PROMPT_CHARS,
    PROMPT_TOKENS,
    AffinityMap,
    continuity_key,
    prefix_fingerprint,
)


def digest(*parts: str) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()


# continuity_key


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({"x-nexus-session-id": "s1"}, {}, ("session", "s1")),
        ({"x-msty-nexus-session-id": "s2"}, {}, ("session", "s2")),
        (
            {"x-nexus-session-id": "s1", "x-msty-nexus-session-id": "s2"},
            {"prompt_cache_key": "p", "user": "u"},
            ("session", "s1"),
        ),
        ({"x-msty-nexus-session-id": "s2"}, {"prompt_cache_key": "p"}, ("session", "s2")),
        ({}, {"prompt_cache_key": "p", "user": "u"}, ("prompt_cache_key", "p")),
        ({}, {"user": "u"}, ("user", "u")),
        ({"x-nexus-session-id": "  s1 \t"}, {}, ("session", "s1")),
        ({"x-nexus-session-id": "   "}, {"user": "u"}, ("user", "u")),
        ({}, {"prompt_cache_key": "", "user": "u"}, ("user", "u")),
        ({}, {"prompt_cache_key": 42, "user": "u"}, ("user", "u")),
        ({}, {"prompt_cache_key": ["p"], "user": {"id": 1}}, None),
        ({"x-other": "s1"}, {"messages": []}, None),
        ({}, {}, None),
    ],
)
def test_it_takes_the_first_present_conversation_key_and_hashes_it(headers, body, expected):
    key = continuity_key("chat", headers, body)

    if expected is None:
        assert key is None
    else:
        namespace, value = expected
        assert key == digest(namespace, "chat", value)
        assert len(key) == 32
        assert value not in key


def test_the_same_key_in_two_pools_never_collides():
    headers = {"x-nexus-session-id": "s1"}

    assert continuity_key("a", headers, {}) != continuity_key("b", headers, {})


def test_a_session_and_a_user_with_the_same_value_are_different_conversations():
    assert continuity_key("chat", {"x-nexus-session-id": "42"}, {}) != continuity_key(
        "chat", {}, {"user": "42"}
    )


def test_both_session_headers_name_the_same_conversation():
    assert continuity_key("chat", {"x-nexus-session-id": "s"}, {}) == continuity_key(
        "chat", {"x-msty-nexus-session-id": "s"}, {}
    )


def test_a_key_with_a_lone_surrogate_from_json_is_hashed_not_refused():
    body = json.loads('{"user": "\\ud800x"}')

    assert continuity_key("chat", {}, body) is not None


# prefix_fingerprint

SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "What is a pool?"}
ANSWER = {"role": "assistant", "content": "A group of targets."}
SECOND = {"role": "user", "content": "And a tier?"}


def chat(*messages: dict) -> dict:
    return {"model": "@pool/chat", "messages": list(messages)}


def test_later_turns_of_a_chat_keep_its_fingerprint():
    first_turn = prefix_fingerprint("chat", chat(SYSTEM, FIRST), "chat")
    later_turn = prefix_fingerprint("chat", chat(SYSTEM, FIRST, ANSWER, SECOND), "chat")

    assert first_turn is not None
    assert later_turn == first_turn


@pytest.mark.parametrize(
    "other",
    [
        chat(SYSTEM, {"role": "user", "content": "What is a tier?"}),
        chat({"role": "system", "content": "You are verbose."}, FIRST),
        chat(FIRST),
        chat({"role": "developer", "content": "You are terse."}, FIRST),
    ],
)
def test_chats_that_differ_in_their_opening_get_different_fingerprints(other):
    assert prefix_fingerprint("chat", other, "chat") != prefix_fingerprint(
        "chat", chat(SYSTEM, FIRST), "chat"
    )


def test_the_same_chat_in_two_pools_gets_different_fingerprints():
    body = chat(SYSTEM, FIRST)

    assert prefix_fingerprint("a", body, "chat") != prefix_fingerprint("b", body, "chat")


def test_a_chat_fingerprint_ignores_everything_but_role_and_content_of_the_opening():
    plain = chat(SYSTEM, FIRST)
    decorated = {**chat(SYSTEM, {**FIRST, "name": "ann"}, SECOND), "temperature": 0.2, "n": 3}

    assert prefix_fingerprint("chat", decorated, "chat") == prefix_fingerprint(
        "chat", plain, "chat"
    )


def test_content_parts_are_fingerprinted_like_text():
    parts = {"role": "user", "content": [{"type": "text", "text": "What is a pool?"}]}

    assert prefix_fingerprint("chat", chat(SYSTEM, parts), "chat") is not None


def test_a_long_opening_message_counts_only_its_first_characters():
    long_a = {"role": "user", "content": "x" * 10_000 + "a"}
    long_b = {"role": "user", "content": "x" * 10_000 + "b"}

    assert prefix_fingerprint("chat", chat(long_a), "chat") == prefix_fingerprint(
        "chat", chat(long_b), "chat"
    )


@pytest.mark.parametrize(
    "body",
    [
        chat(),
        chat(SYSTEM),
        chat(SYSTEM, ANSWER),
        {"messages": "hello"},
        {"messages": ["hello"]},
        {},
    ],
)
def test_a_chat_without_a_user_message_has_no_fingerprint(body):
    assert prefix_fingerprint("chat", body, "chat") is None


def test_long_completion_prompts_sharing_their_start_share_a_fingerprint():
    start = "Translate to French.\n" + "x" * PROMPT_CHARS

    first = prefix_fingerprint("p", {"prompt": start + "one"}, "completions")
    second = prefix_fingerprint("p", {"prompt": [start + "two, and more"]}, "completions")

    assert first is not None
    assert second == first


def test_token_prompts_are_fingerprinted_by_their_first_ids():
    tokens = list(range(PROMPT_TOKENS))

    first = prefix_fingerprint("p", {"prompt": tokens}, "completions")
    longer = prefix_fingerprint("p", {"prompt": [*tokens, 7, 8]}, "completions")

    assert first is not None
    assert longer == first


@pytest.mark.parametrize(
    "prompt",
    [
        "x" * (PROMPT_CHARS - 1),
        ["x" * PROMPT_CHARS, "y" * PROMPT_CHARS],  # a batch
        list(range(PROMPT_TOKENS - 1)),
        [True] * PROMPT_TOKENS,
        None,
    ],
)
def test_short_or_batched_completion_prompts_have_no_fingerprint(prompt):
    assert prefix_fingerprint("p", {"prompt": prompt}, "completions") is None


def test_embeddings_have_no_fingerprint():
    assert prefix_fingerprint("e", {"input": "x" * 5000}, "embeddings") is None


# AffinityMap


def test_it_remembers_where_a_key_went_last():
    affinity = AffinityMap(max_entries=10, ttl_s=60)
    affinity.put("k", 1, now=0.0)
    affinity.put("k", 2, now=1.0)

    assert affinity.get("k", now=2.0) == 2
    assert affinity.get("other", now=2.0) is None


def test_an_entry_expires_ttl_after_its_last_routing():
    affinity = AffinityMap(max_entries=10, ttl_s=60)
    affinity.put("k", 1, now=0.0)
    affinity.put("k", 1, now=50.0)

    assert affinity.get("k", now=109.9) == 1
    assert affinity.get("k", now=110.0) is None
    assert len(affinity) == 0


def test_reading_an_entry_does_not_extend_its_life():
    affinity = AffinityMap(max_entries=10, ttl_s=60)
    affinity.put("k", 1, now=0.0)

    assert affinity.get("k", now=59.0) == 1
    assert affinity.get("k", now=60.0) is None


def test_it_drops_the_least_recently_routed_key_when_full():
    affinity = AffinityMap(max_entries=2, ttl_s=60)
    affinity.put("a", 1, now=0.0)
    affinity.put("b", 2, now=1.0)
    affinity.put("a", 1, now=2.0)  # routed again: now the most recent

    affinity.put("c", 3, now=3.0)

    assert len(affinity) == 2
    assert affinity.get("b", now=3.0) is None
    assert affinity.get("a", now=3.0) == 1
    assert affinity.get("c", now=3.0) == 3


def test_writing_sweeps_expired_entries_out():
    affinity = AffinityMap(max_entries=100, ttl_s=10)
    for i in range(5):
        affinity.put(f"old{i}", 1, now=float(i))

    affinity.put("new", 2, now=14.5)

    assert len(affinity) == 1


def test_forgetting_a_target_drops_every_key_pointing_at_it():
    affinity = AffinityMap(max_entries=10, ttl_s=60)
    affinity.put("a", 1, now=0.0)
    affinity.put("b", 2, now=0.0)
    affinity.put("c", 1, now=0.0)

    assert affinity.forget_target(1) == 2
    assert affinity.get("a", now=1.0) is None
    assert affinity.get("b", now=1.0) == 2


@pytest.mark.parametrize(("max_entries", "ttl_s"), [(0, 60.0), (10, 0.0)])
def test_it_rejects_a_map_that_could_hold_nothing(max_entries, ttl_s):
    with pytest.raises(ValueError):
        AffinityMap(max_entries=max_entries, ttl_s=ttl_s)
