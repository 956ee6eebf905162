"""Two live gateways (daphne) sharing Redis enforce one token's limits together.

Done-when 2 of issue 10: 60 requests per minute across both processes (the 61st is refused with
Retry-After), and a tokens-per-minute limit counted from real streamed usage of a simulator.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from nexus.models import ApiToken
from pools.models import Pool
from tests.nexus.factories import make_pool, make_target
from tests.support.live import LiveServer, running_nexus
from tests.support.simulator import running_simulator
from tests.support.traffic import Answer, chat_body, send


@pytest.fixture
def prefix() -> Iterator[str]:
    """A Redis key prefix of this test's own, removed afterwards."""
    prefix = f"test-limits-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def streamed_tokens(answer: Answer) -> int:
    """Return the prompt and completion tokens a stream's usage event reported."""
    usages = [json.loads(e).get("usage") for e in answer.events if e != "[DONE]"]
    usage = [u for u in usages if u][-1]
    return usage["prompt_tokens"] + usage["completion_tokens"]


def test_two_gateways_share_one_tokens_request_and_token_budgets(
    committed_db, django_db_blocker, tmp_path: Path, prefix: str
) -> None:
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=0, concurrency=8) as engine:
        with django_db_blocker.unblock():
            pool = make_pool("limited")
            make_target(
                pool, "only", base_url=engine.base_url, model_id="demo-8b", capacity_weight=8
            )
            per_minute, per_minute_secret = ApiToken.issue("sixty", requests_per_minute=60)
            tokens, tokens_secret = ApiToken.issue("tokens", tokens_per_minute=300)
        env = {"NEXUS_LEDGER": "redis", "NEXUS_REDIS_PREFIX": prefix}
        try:
            with running_nexus(tmp_path, **env) as one, running_nexus(tmp_path, **env) as two:
                servers: list[LiveServer] = [one, two]
                urls = [f"{server.url}/v1/chat/completions" for server in servers]
                body = chat_body("limited")
                # 60 requests, alternating between the two processes, then the 61st.
                answers = [send(urls[n % 2], per_minute_secret, body) for n in range(61)]

                # Streams that did not ask for usage, until their reported usage reaches 300.
                stream_body = chat_body("limited", max_tokens=40, stream=True)
                streams: list[Answer] = []
                used = 0
                while used < 300 and len(streams) < 20:
                    streams.append(send(urls[len(streams) % 2], tokens_secret, stream_body))
                    used += streamed_tokens(streams[-1])
                # A stream's tokens are counted as it ends: give the last one a moment.
                time.sleep(0.3)
                over = [send(url, tokens_secret, stream_body) for url in urls]
        finally:
            with django_db_blocker.unblock():
                Pool.objects.filter(pk=pool.pk).delete()
                ApiToken.objects.filter(pk__in=[per_minute.pk, tokens.pk]).delete()

    assert [a.status for a in answers[:60]] == [200] * 60
    # Both processes answered: the budget was one across them.
    assert len({a.request_id[:16] for a in answers[:60]}) == 2
    refused = answers[60]
    assert refused.status == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.error()["code"] == "rate_limit_exceeded"
    assert "requests per minute" in refused.error()["message"]

    assert [s.status for s in streams] == [200] * len(streams)
    assert 1 < len(streams) < 20 and used >= 300
    assert [a.status for a in over] == [429, 429]
    assert all("tokens per minute" in a.error()["message"] for a in over)
    assert all(1 <= int(a.headers["retry-after"]) <= 60 for a in over)
