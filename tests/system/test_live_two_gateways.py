"""Two gateway processes behind one pool: the Live page's requests/s is the sum of both, as the
load generator measured it (within 10 %), and it says that two gateways reported.

The page's rate covers the latest 10 s of complete buckets (pools.live_figures); the generator's
is measured over the same 10 s of its own answers' end times, less half a publication interval
(each gateway adds what it counted once a second, so a request counts about 0.5 s after it
ended). On a busy machine the paced load bends; comparing one window keeps the test honest.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import Client

from nexus.models import ApiToken
from pools import live_figures
from pools.gateway.publish import PUBLISH_INTERVAL_S
from pools.live_figures import RATE_WINDOW_S, last_complete
from pools.models import Pool
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.live import running_nexus
from tests.support.simulator import running_simulator
from tests.support.traffic import Answer, chat_body, send

log = logging.getLogger(__name__)

pytestmark = pytest.mark.serial  # a paced load: other tests' CPU would bend its rate

RATE = 8.0  # requests per second over both gateways: well within what 2 shared cores serve
# Read the page once the rate window (10 s, plus the publication lag) is all inside the load;
# the load goes on a little past the read, which then sees a steady rate to its end.
READ_AT_S = 16.0
DURATION_S = READ_AT_S + 2.0


@pytest.fixture
def prefix(settings: Any) -> Iterator[str]:
    """A Redis key prefix of this test's own, for the gateways and this process alike."""
    prefix = f"test-live2-{uuid.uuid4().hex[:12]}"
    settings.NEXUS_REDIS_PREFIX = prefix
    yield prefix
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def figure(html: str, name: str) -> str:
    found = re.search(rf'data-figure="{name}">([^<]*)<', html)
    assert found, f"no {name} figure on the page"
    return found.group(1)


def test_the_live_page_sums_the_requests_of_two_gateways(
    committed_db, django_db_blocker, tmp_path: Path, prefix: str
) -> None:
    with running_simulator(model="demo-8b", ttft_ms=5, tpot_ms=2, concurrency=32) as engine:
        with django_db_blocker.unblock():
            pool = make_pool("two-gateways")
            make_target(pool, "only", base_url=engine.base_url, model_id="demo-8b",
                        capacity_weight=32)  # fmt: skip
            token_row, token = ApiToken.issue("paced load")
            staff = make_user("live-watcher", staff=True)
        env = {"NEXUS_REDIS_PREFIX": prefix}
        try:
            with running_nexus(tmp_path, **env) as one, running_nexus(tmp_path, **env) as two:
                urls = [f"{server.url}/v1/chat/completions" for server in (one, two)]
                body = chat_body("two-gateways", max_tokens=2)
                futures: list[Future[Answer]] = []
                total = int(RATE * DURATION_S)

                def read_page() -> tuple[float, str]:
                    with django_db_blocker.unblock():
                        client = Client()
                        client.force_login(staff)
                        read_at = time.time()
                        return read_at, client.get("/live/two-gateways/").content.decode()

                reading: Future[tuple[float, str]] | None = None
                with ThreadPoolExecutor(max_workers=16) as executor, ThreadPoolExecutor(1) as pager:
                    started = time.monotonic()
                    for k in range(total):
                        # An open loop: request k leaves at k / RATE, whoever is still busy.
                        time.sleep(max(0.0, started + k / RATE - time.monotonic()))
                        futures.append(executor.submit(send, urls[k % 2], token, body))
                        if reading is None and time.monotonic() - started >= READ_AT_S:
                            reading = pager.submit(read_page)
                    answers = [future.result() for future in futures]
                    assert reading is not None
                    read_at, page = reading.result()
                # Answers' end times on the wall clock, which the gateways' buckets use.
                offset = time.time() - time.monotonic()
        finally:
            with django_db_blocker.unblock():
                Pool.objects.filter(pk=pool.pk).delete()
                token_row.delete()

    assert [answer.status for answer in answers] == [200] * total
    window_end = last_complete(read_at) + live_figures.BUCKET_S - PUBLISH_INTERVAL_S / 2
    ended = [answer.finished + offset for answer in answers]
    measured = sum(window_end - RATE_WINDOW_S <= t < window_end for t in ended) / RATE_WINDOW_S
    shown = float(figure(page, "requests").removesuffix(" req/s"))
    log.info("load generator: %.2f req/s; Live page: %s req/s", measured, shown)
    assert figure(page, "gateways") == "2"
    assert abs(shown - measured) <= 0.1 * measured, (shown, measured)
