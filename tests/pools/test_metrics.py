"""Prometheus metrics: what the gateway observes appears at /metrics, for whoever may read it."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from nexus.models import ApiToken
from nexus.scopes import TokenKind
from pools.gateway import metrics
from tests.nexus.factories import make_user
from tests.support.prometheus import Samples, samples


@pytest.fixture(autouse=True)
def public_metrics(settings: pytest.FixtureRequest) -> None:
    """Metrics open to anyone unless a test says otherwise (the private ones below do)."""
    settings.NEXUS_METRICS_PUBLIC = True


@pytest.fixture
def pool() -> str:
    """A pool slug of this test's own: the metrics live in the process-wide registry."""
    return f"p{uuid.uuid4().hex[:10]}"


def scrape(client: Client | None = None, **headers: str) -> Samples:
    """Return every sample at /metrics by name and labels."""
    response = (client or Client()).get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return samples(response.content.decode())


def labels(**values: str) -> frozenset:
    return frozenset(values.items())


def test_observed_requests_appear_with_their_pool_target_and_outcome(pool: str) -> None:
    metrics.observe_request(pool, "gpu-1", "ok", queue_wait_s=0.02, ttft_s=0.1, total_s=1.5)
    metrics.observe_request(pool, "gpu-1", "ok", queue_wait_s=0.0, ttft_s=0.2, total_s=0.5)
    metrics.observe_request(pool, None, "queue_full", queue_wait_s=None, ttft_s=None, total_s=0.001)

    samples = scrape()

    assert samples["nexus_requests_total", labels(pool=pool, target="gpu-1", outcome="ok")] == 2
    assert samples["nexus_requests_total", labels(pool=pool, target="", outcome="queue_full")] == 1
    assert samples["nexus_queue_wait_seconds_count", labels(pool=pool)] == 2
    assert samples["nexus_queue_wait_seconds_sum", labels(pool=pool)] == pytest.approx(0.02)
    ttft = labels(pool=pool, target="gpu-1")
    assert samples["nexus_time_to_first_token_seconds_count", ttft] == 2
    assert samples["nexus_time_to_first_token_seconds_bucket", ttft | {("le", "0.1")}] == 1
    assert samples["nexus_request_duration_seconds_sum", ttft] == pytest.approx(2.0)
    assert samples["nexus_request_duration_seconds_count", labels(pool=pool, target="")] == 1


def test_prompt_and_completion_tokens_are_counted_per_pool_and_target(pool: str) -> None:
    metrics.observe_request(pool, "gpu-1", "ok", 0.0, 0.1, 0.5, usage=(12, 30))
    metrics.observe_request(pool, "gpu-1", "ok", 0.0, 0.1, 0.5, usage=(8, 2))
    metrics.observe_request(pool, "gpu-2", "ok", 0.0, 0.1, 0.5, usage=None)

    samples = scrape()

    prompt = labels(pool=pool, target="gpu-1", kind="prompt")
    completion = labels(pool=pool, target="gpu-1", kind="completion")
    assert samples["nexus_tokens_total", prompt] == 20
    assert samples["nexus_tokens_total", completion] == 32
    assert ("nexus_tokens_total", labels(pool=pool, target="gpu-2", kind="prompt")) not in samples


def test_attempts_in_flight_and_queue_appear(pool: str) -> None:
    metrics.observe_attempt(pool, "gpu-1", "connect")
    metrics.observe_attempt(pool, "gpu-1", "connect")
    metrics.observe_attempt(pool, "gpu-2", "response")
    metrics.set_in_flight(pool, "gpu-1", 3)
    metrics.set_queued(pool, 5)

    samples = scrape()

    assert samples["nexus_attempts_total", labels(pool=pool, target="gpu-1", phase="connect")] == 2
    assert samples["nexus_attempts_total", labels(pool=pool, target="gpu-2", phase="response")] == 1
    assert samples["nexus_in_flight", labels(pool=pool, target="gpu-1")] == 3
    assert samples["nexus_queued", labels(pool=pool)] == 5


def test_series_of_deleted_targets_and_pools_are_removed(pool: str) -> None:
    gone_pool = f"{pool}-gone"
    metrics.observe_request(pool, "kept", "ok", queue_wait_s=0.0, ttft_s=0.1, total_s=0.2)
    metrics.observe_request(pool, None, "no_target", queue_wait_s=None, ttft_s=None, total_s=0.0)
    metrics.observe_attempt(pool, "deleted", "connect")
    metrics.set_in_flight(pool, "deleted", 1)
    metrics.set_queued(gone_pool, 2)

    metrics.retain([(pool, "kept")])

    names = {(name, dict(sample_labels).get("target")) for name, sample_labels in scrape()}
    assert ("nexus_requests_total", "kept") in names
    assert ("nexus_requests_total", "") in names  # the pool remains, so its target-less series do
    assert ("nexus_attempts_total", "deleted") not in names
    assert ("nexus_in_flight", "deleted") not in names
    assert not any(dict(sample_labels).get("pool") == gone_pool for _, sample_labels in scrape())


@pytest.mark.django_db
def test_private_metrics_are_refused_to_anonymous_callers(
    settings: pytest.FixtureRequest,
) -> None:
    settings.NEXUS_METRICS_PUBLIC = False

    response = Client().get("/metrics")

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.django_db
def test_private_metrics_are_served_to_staff_and_their_admin_tokens(
    settings: pytest.FixtureRequest, pool: str
) -> None:
    settings.NEXUS_METRICS_PUBLIC = False
    metrics.set_queued(pool, 1)
    staff, teammate = make_user("owner", staff=True), make_user("teammate")
    browser = Client()
    browser.force_login(staff)
    _, staff_secret = ApiToken.issue("prometheus", kind=TokenKind.ADMIN, created_by=staff)
    _, client_secret = ApiToken.issue("app", created_by=staff)
    _, teammate_secret = ApiToken.issue("mine", kind=TokenKind.ADMIN, created_by=teammate)

    assert ("nexus_queued", labels(pool=pool)) in scrape(browser)
    assert ("nexus_queued", labels(pool=pool)) in scrape(Authorization=f"Bearer {staff_secret}")
    for secret, status in ((client_secret, 403), (teammate_secret, 403), ("nx-unknown", 401)):
        response = Client().get("/metrics", headers={"Authorization": f"Bearer {secret}"})
        assert response.status_code == status


@pytest.mark.django_db
def test_a_signed_in_teammate_may_not_read_private_metrics(
    settings: pytest.FixtureRequest,
) -> None:
    settings.NEXUS_METRICS_PUBLIC = False
    client = Client()
    client.force_login(make_user("teammate"))

    assert client.get("/metrics").status_code == 403
