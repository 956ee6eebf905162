"""Autoscaling rules and scale events: the admin API (as the three personas see it), and one
autoscaling cycle (serving.scaling) on Kernel samples, with the database and Redis only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from nodes.models import Node
from pools.gateway.snapshot import pool_entry
from pools.models import Pool, RoutingRecord
from serving import metrics, scaling
from serving.autoscaling import MetricSource, Outcome
from serving.models import AutoScalingRule, ModelFolder, Route, RouteState, ScaleEvent, Service
from tests.deployments.factories import make_node
from tests.nexus.factories import make_user
from tests.serving.fleet import make_service, model_folder

pytestmark = pytest.mark.django_db

RULES = "/api/v1/services/chat/autoscaling-rules/"
QUEUE_RULE = {
    "metric_source": "inference_framework",
    "metric_name": "vllm:num_requests_waiting",
    "condition": "scale_out",
    "max_threshold": 5,
    "step_size": 1,
    "cooldown_s": 30,
    "min_replicas": 1,
    "max_replicas": 3,
}


@pytest.fixture(autouse=True)
def own_redis_keys(settings: Any) -> None:
    """Samples are keyed by route id, which a rolled-back test may hand out again."""
    settings.NEXUS_REDIS_PREFIX = f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def folder() -> Iterator[ModelFolder]:
    with model_folder() as made:
        yield made


@pytest.fixture
def chat(folder: ModelFolder) -> Service:
    return make_service(folder, "chat", replicas=1)


# The API


def test_the_owner_adds_a_rule_and_sees_it_listed_with_its_signed_step(
    owner: APIClient, chat: Service
) -> None:
    created = owner.post(RULES, QUEUE_RULE, format="json")
    listed = owner.get(RULES)

    assert created.status_code == 201, created.content
    assert created.json()["step"] == "+1"
    assert created.json()["last_triggered_at"] is None
    assert listed.json()["count"] == 1
    assert listed.json()["results"][0]["metric_name"] == "vllm:num_requests_waiting"


def test_a_prometheus_preset_fills_the_metric_query_and_cooldown(
    owner: APIClient, chat: Service
) -> None:
    created = owner.post(
        RULES,
        {
            "metric_source": "prometheus",
            "prometheus_preset": "vllm-requests-waiting",
            "condition": "scale_in_out",
            "min_threshold": 0.5,
            "max_threshold": 4,
        },
        format="json",
    )

    assert created.status_code == 201, created.content
    rule = created.json()
    assert rule["metric_name"] == "vllm:num_requests_waiting"
    assert rule["prometheus_query"] == (
        'avg_over_time(vllm:num_requests_waiting{nexus_service="$service"}[$window])'
    )
    assert rule["cooldown_s"] == 60
    assert rule["step"] == "±1"


def test_a_rule_missing_its_threshold_or_with_inverted_bounds_is_refused(
    owner: APIClient, chat: Service
) -> None:
    no_threshold = owner.post(RULES, {**QUEUE_RULE, "max_threshold": None}, format="json")
    inverted = owner.post(RULES, {**QUEUE_RULE, "min_replicas": 4}, format="json")
    no_query = owner.post(
        RULES, {**QUEUE_RULE, "metric_source": "prometheus", "metric_name": ""}, format="json"
    )

    assert no_threshold.status_code == 400
    assert no_threshold.json() == {"max_threshold": ["Scaling out needs a max threshold."]}
    assert inverted.json() == {"max_replicas": ["Must be at least the min replicas."]}
    assert no_query.json() == {
        "prometheus_query": ["A Prometheus rule needs a query (pick a preset)."]
    }


def test_the_owner_edits_and_deletes_a_rule(owner: APIClient, chat: Service) -> None:
    rule_id = owner.post(RULES, QUEUE_RULE, format="json").json()["id"]

    edited = owner.patch(f"{RULES}{rule_id}/", {"max_threshold": 9}, format="json")
    refused = owner.patch(f"{RULES}{rule_id}/", {"max_replicas": 0}, format="json")
    deleted = owner.delete(f"{RULES}{rule_id}/")

    assert edited.status_code == 200, edited.content
    assert edited.json()["max_threshold"] == 9
    assert refused.status_code == 400
    assert deleted.status_code == 204
    assert not AutoScalingRule.objects.exists()


def test_rules_filter_by_created_and_last_triggered_ranges(owner: APIClient, chat: Service) -> None:
    old = AutoScalingRule.objects.create(service=chat, **rule_fields())
    new = AutoScalingRule.objects.create(service=chat, **rule_fields())
    week_ago = timezone.now() - timedelta(days=7)
    AutoScalingRule.objects.filter(pk=old.pk).update(created_at=week_ago)
    AutoScalingRule.objects.filter(pk=new.pk).update(last_triggered_at=timezone.now())
    day_ago = (timezone.now() - timedelta(days=1)).isoformat()

    recent = owner.get(RULES, {"created_after": day_ago})
    triggered = owner.get(RULES, {"triggered_after": day_ago})
    paged = owner.get(RULES, {"limit": 1, "offset": 1})
    bad = owner.get(RULES, {"created_after": "yesterday"})

    assert [r["id"] for r in recent.json()["results"]] == [new.pk]
    assert [r["id"] for r in triggered.json()["results"]] == [new.pk]
    assert (paged.json()["count"], [r["id"] for r in paged.json()["results"]]) == (2, [new.pk])
    assert bad.status_code == 400


def test_a_viewer_reads_rules_and_events_but_cannot_change_them(
    teammate: APIClient, chat: Service
) -> None:
    rule = AutoScalingRule.objects.create(service=chat, **rule_fields())

    assert teammate.get(RULES).status_code == 200
    assert teammate.get("/api/v1/services/chat/scale-events/").status_code == 200
    assert teammate.post(RULES, QUEUE_RULE, format="json").status_code == 403
    assert teammate.delete(f"{RULES}{rule.pk}/").status_code == 403


def test_an_outsider_is_refused(outsider: APIClient, chat: Service) -> None:
    assert outsider.get(RULES).status_code in (401, 403)


def test_a_service_of_another_project_is_not_found(owner: APIClient, folder: ModelFolder) -> None:
    assert owner.get("/api/v1/services/nothing/autoscaling-rules/").status_code == 404


def test_the_preview_says_no_data_available_without_a_prometheus_server(
    owner: APIClient, chat: Service, settings: Any
) -> None:
    settings.NEXUS_PROMETHEUS_URL = ""

    previewed = owner.post(
        f"{RULES}preview/", {"prometheus_preset": "vllm-requests-waiting"}, format="json"
    )

    assert previewed.status_code == 200, previewed.content
    assert previewed.json()["query"] == (
        'avg_over_time(vllm:num_requests_waiting{nexus_service="chat"}[60s])'
    )
    assert previewed.json()["text"] == (
        "No data available (no Prometheus server is configured (NEXUS_PROMETHEUS_URL))"
    )


def test_the_presets_are_listed(owner: APIClient) -> None:
    presets = owner.get("/api/v1/autoscaling-presets/").json()

    assert presets[0]["key"] == "vllm-requests-waiting"
    assert presets[0]["cooldown_s"] == 60


# One cycle, on Kernel samples the node refresh left on the node


def rule_fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "metric_source": MetricSource.KERNEL,
        "metric_name": "cpu_util",
        "condition": "scale_in_out",
        "min_threshold": 20.0,
        "max_threshold": 80.0,
        "step_size": 1,
        "cooldown_s": 30,
        "min_replicas": 1,
        "max_replicas": 3,
        "window_s": 60,
    }
    fields.update(changes)
    return fields


def ready_replica(service: Service, node: Node, process_id: str) -> Route:
    assert service.latest_revision is not None
    return Route.objects.create(
        service=service,
        revision=service.latest_revision,
        node=node,
        process_id=process_id,
        state=RouteState.HEALTHY,
    )


def report_cpu(node: Node, at: datetime, **cpu_by_process: float) -> None:
    """Store what the node refresh keeps from the agent's /agent/v1/metrics."""
    node.last_seen_at = at
    node.metrics = {
        "node": {"net_rx_bytes_per_s": 10.0, "net_tx_bytes_per_s": 20.0},
        "processes": [
            {"id": pid, "pid": 1, "cpu_percent": cpu, "memory_bytes": 1 << 20}
            for pid, cpu in cpu_by_process.items()
        ],
    }
    node.save(update_fields=["last_seen_at", "metrics"])


def test_a_busy_service_scales_out_once_then_cools_down(chat: Service) -> None:
    node = make_node("node-a")
    rule = AutoScalingRule.objects.create(service=chat, **rule_fields())
    ready_replica(chat, node, "p1")
    now = timezone.now()
    report_cpu(node, now, p1=95.0)

    first = scaling.evaluate(chat, now)
    chat.refresh_from_db()
    second = scaling.evaluate(chat, now + timedelta(seconds=10))
    third = scaling.evaluate(chat, now + timedelta(seconds=20))

    assert first is not None and first.desired == 2
    assert chat.desired_replicas == 2
    rule.refresh_from_db()
    assert rule.last_triggered_at == now
    assert second is not None and not second.changes
    assert second.verdict(rule.pk).outcome == Outcome.COOLDOWN
    assert third is not None and not third.changes
    events = list(ScaleEvent.objects.order_by("created_at", "id"))
    # The cooldown is recorded once, not once per cycle.
    assert [e.outcome for e in events] == [Outcome.SCALED_OUT, Outcome.COOLDOWN]
    scaled = events[0]
    assert (scaled.value, scaled.replicas_before, scaled.replicas_after) == (95.0, 1, 2)
    assert (scaled.window_s, scaled.aggregation, scaled.rule_text) == (
        60,
        "avg",
        "cpu_util < 20 or > 80",
    )
    assert scaled.reason == "95 > 80: 1 → 2"
    assert scaled.cooldown_until == now + timedelta(seconds=30)


def test_a_quiet_service_scales_in_to_the_rules_min(chat: Service) -> None:
    Service.objects.filter(pk=chat.pk).update(desired_replicas=3)
    chat.refresh_from_db()
    node = make_node("node-a")
    AutoScalingRule.objects.create(service=chat, **rule_fields(step_size=5))
    for pid in ("p1", "p2", "p3"):
        ready_replica(chat, node, pid)
    now = timezone.now()
    report_cpu(node, now, p1=5.0, p2=10.0, p3=3.0)

    decision = scaling.evaluate(chat, now)

    chat.refresh_from_db()
    assert decision is not None
    assert chat.desired_replicas == 1
    event = ScaleEvent.objects.get()
    assert event.value == pytest.approx(6.0)
    assert event.series == 3
    assert event.reason == "6 < 20: 3 → 1 (step 5 clamped to the min of 1)"


def test_without_samples_a_rule_has_no_data_recorded_once_and_nothing_scales(
    chat: Service,
) -> None:
    node = make_node("node-a")
    AutoScalingRule.objects.create(service=chat, **rule_fields(min_threshold=50.0))
    ready_replica(chat, node, "p1")
    now = timezone.now()

    for cycle in range(3):
        scaling.evaluate(chat, now + timedelta(seconds=10 * cycle))

    chat.refresh_from_db()
    assert chat.desired_replicas == 1
    event = ScaleEvent.objects.get()
    assert event.outcome == Outcome.NO_DATA
    assert event.value is None
    assert event.reason == "no data: no cpu_util sample in the last 60 s"


def test_a_sample_older_than_the_window_is_no_data(chat: Service) -> None:
    node = make_node("node-a")
    AutoScalingRule.objects.create(service=chat, **rule_fields())
    ready_replica(chat, node, "p1")
    now = timezone.now()
    report_cpu(node, now - timedelta(seconds=300), p1=0.0)

    decision = scaling.evaluate(chat, now)

    assert decision is not None and not decision.changes
    assert ScaleEvent.objects.get().outcome == Outcome.NO_DATA


def test_conflicting_rules_scale_out_and_record_the_overruled_one(chat: Service) -> None:
    Service.objects.filter(pk=chat.pk).update(desired_replicas=2)
    chat.refresh_from_db()
    node = make_node("node-a")
    low_cpu = AutoScalingRule.objects.create(
        service=chat, **rule_fields(condition="scale_in", min_threshold=50.0)
    )
    high_mem = AutoScalingRule.objects.create(
        service=chat,
        **rule_fields(metric_name="mem", condition="scale_out", max_threshold=1000.0),
    )
    ready_replica(chat, node, "p1")
    now = timezone.now()
    report_cpu(node, now, p1=10.0)

    scaling.evaluate(chat, now)

    chat.refresh_from_db()
    assert chat.desired_replicas == 3
    events = {e.rule_id: e for e in ScaleEvent.objects.all()}
    assert events[high_mem.pk].outcome == Outcome.SCALED_OUT
    assert events[high_mem.pk].overruled == [low_cpu.pk]
    assert events[low_cpu.pk].outcome == Outcome.OVERRULED


def test_the_cycle_task_scales_every_service_with_rules(chat: Service) -> None:
    node = make_node("node-a")
    AutoScalingRule.objects.create(service=chat, **rule_fields())
    ready_replica(chat, node, "p1")
    report_cpu(node, timezone.now(), p1=99.0)

    assert scaling.autoscale_all() == {"scaled": 1}
    chat.refresh_from_db()
    assert chat.desired_replicas == 2


def test_samples_are_parsed_from_prometheus_text() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="a"} 3.0\n'
        'vllm:num_requests_waiting{model_name="b"} 4.0\n'
        "# TYPE vllm:prompt_tokens counter\n"
        "vllm:prompt_tokens_total 12.0\n"
    )

    assert metrics.parse_metrics(text) == {
        "vllm:num_requests_waiting": 7.0,
        "vllm:prompt_tokens_total": 12.0,
    }
    assert metrics.parse_metrics("not { prometheus") == {}


def test_the_admin_lists_rules_and_read_only_events(chat: Service) -> None:
    rule = AutoScalingRule.objects.create(service=chat, **rule_fields())
    ScaleEvent.objects.create(
        service=chat,
        rule=rule,
        rule_text=rule.describe(),
        metric_source=rule.metric_source,
        value=None,
        window_s=60,
        aggregation="avg",
        replicas_before=1,
        replicas_after=1,
        outcome=Outcome.NO_DATA,
        reason="no data: no samples in the window",
    )
    admin = APIClient()
    admin.force_login(make_user("root", staff=True, superuser=True))

    rules = admin.get("/admin/serving/autoscalingrule/")
    events = admin.get("/admin/serving/scaleevent/")

    assert rules.status_code == 200 and "cpu_util &lt; 20 or &gt; 80" in rules.content.decode()
    assert events.status_code == 200 and "No data" in events.content.decode()
    assert admin.get("/admin/serving/scaleevent/add/").status_code == 403


# Scale to zero (the wake itself runs end to end in tests/system/test_autoscaling.py)


def with_pool(service: Service, idle_s: int) -> Service:
    pool = Pool.objects.create(name=service.name, slug=service.name, managed=True)
    Service.objects.filter(pk=service.pk).update(pool=pool, scale_to_zero_after_s=idle_s)
    service.refresh_from_db()
    return service


def test_an_idle_service_goes_to_zero_after_its_idle_period_only(chat: Service) -> None:
    with_pool(chat, idle_s=60)
    changed = chat.updated_at

    early = scaling.sleep_if_idle(chat, changed + timedelta(seconds=59))
    late = scaling.sleep_if_idle(chat, changed + timedelta(seconds=61))

    chat.refresh_from_db()
    assert (early, late, chat.desired_replicas) == (False, True, 0)
    event = ScaleEvent.objects.get()
    assert (event.outcome, event.replicas_before, event.replicas_after) == ("scaled_in", 1, 0)
    assert event.reason == "no request for 61 s (at least 60 s): scaled to zero"
    assert event.rule_text == "scale to zero after 60 s idle"


def test_a_recent_request_keeps_the_service_awake(chat: Service) -> None:
    with_pool(chat, idle_s=60)
    assert chat.pool is not None
    RoutingRecord.objects.create(
        request_id=f"{7:032x}", pool=chat.pool, kind="http", outcome="ok", status_code=200
    )

    assert not scaling.sleep_if_idle(chat, timezone.now() + timedelta(seconds=30))
    assert scaling.sleep_if_idle(chat, timezone.now() + timedelta(seconds=61))


def test_a_sleeping_service_is_left_to_the_wake_task_and_nothing_wakes_it_unasked(
    chat: Service,
) -> None:
    with_pool(chat, idle_s=60)
    Service.objects.filter(pk=chat.pk).update(desired_replicas=0)

    assert scaling.autoscale_all() == {"sleeping": 1}
    assert scaling.wake_sleeping() == 0  # no gateway holds a request for it
    chat.refresh_from_db()
    assert chat.desired_replicas == 0


def test_the_gateway_holds_requests_for_a_sleeping_service_only(chat: Service) -> None:
    with_pool(chat, idle_s=60)
    Service.objects.filter(pk=chat.pk).update(desired_replicas=0)
    assert chat.pool is not None
    sleeping = pool_entry(Pool.objects.select_related("service").get(pk=chat.pool.pk))
    Service.objects.filter(pk=chat.pk).update(scale_to_zero_after_s=None)
    merely_empty = pool_entry(Pool.objects.select_related("service").get(pk=chat.pool.pk))

    assert sleeping.service is not None and sleeping.service.sleeping
    assert merely_empty.service is not None and not merely_empty.service.sleeping
