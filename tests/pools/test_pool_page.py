"""A pool's page tells the truth about each target: state, health, its node, load; operators
drain and resume targets and the whole pool from it, and resume refuses a target that is not
healthy."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.test import Client

from nexus.models import DEFAULT_PROJECT, ApiToken, Project, Role
from nodes.models import NodeStatus
from pools import console, pool_views
from pools.balancer.health import CircuitReport
from pools.gateway.publish import TargetReading
from pools.models import Target, TargetHealth, TargetState
from tests.deployments.factories import make_node
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.personas import add_member, default_viewer
from tests.support.simulator import running_simulator

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    """A real engine that answers GET /models, as resume asks."""
    with running_simulator(ttft_ms=0, tpot_ms=0) as engine:
        yield engine.base_url


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(make_user("operator", staff=True))
    return client


@pytest.fixture
def teammate() -> Client:
    client = Client()
    client.force_login(default_viewer("teammate"))
    return client


def status_of(page: str, target: Target) -> str:
    """Return the text of a target's status cell on the page."""
    row = page.split(f'id="live-target-{target.pk}"', 1)[1].split("</tr>", 1)[0]
    return row.split('<td class="status">', 1)[1].split("</td>", 1)[0]


def labels(target: Target, reading: TargetReading) -> list[str]:
    return [badge.text for badge in console.target_badges(target, reading, datetime.now(UTC))]


def test_a_drained_target_never_reads_healthy() -> None:
    target = make_target(make_pool("chat"), "a", state=TargetState.DRAINED)

    assert labels(target, TargetReading(in_flight=0)) == ["Drained"]


def test_a_draining_target_shows_what_is_still_in_flight() -> None:
    target = make_target(make_pool("chat"), "a", state=TargetState.DRAINING)

    assert labels(target, TargetReading(in_flight=3)) == ["Draining (3 in flight)"]


def test_an_open_circuit_reads_ejected_with_its_cause_and_time_to_trial() -> None:
    target = make_target(make_pool("chat"), "a")
    circuit = CircuitReport(cause="3 consecutive failures", trial_in_s=4.0)

    assert labels(target, TargetReading(in_flight=0, circuit=circuit)) == [
        "Ejected (trial in 4.0 s, 3 consecutive failures)"
    ]


def test_a_drained_and_ejected_target_shows_both_worst_first() -> None:
    target = make_target(make_pool("chat"), "a", state=TargetState.DRAINED)
    circuit = CircuitReport(cause="3 consecutive failures", trial_in_s=12.0)

    assert labels(target, TargetReading(in_flight=0, circuit=circuit)) == [
        "Ejected (trial in 12 s, 3 consecutive failures)",
        "Drained",
    ]


def test_a_probe_held_circuit_reads_unhealthy() -> None:
    target = make_target(make_pool("chat"), "a")
    circuit = CircuitReport(probe_failing=True)

    assert labels(target, TargetReading(in_flight=0, circuit=circuit)) == ["Unhealthy"]


def test_a_target_on_an_offline_node_says_so_with_the_reason() -> None:
    node = make_node("gpu-1", status=NodeStatus.OFFLINE)
    node.last_error = "connection refused"
    node.save()
    target = make_target(make_pool("chat"), "a", node=node, model_id="")
    target.node = node

    [badge] = labels(target, TargetReading(in_flight=0))
    assert badge.startswith("Node offline (")
    assert badge.endswith("connection refused)")


def test_an_active_healthy_target_reads_active() -> None:
    target = make_target(make_pool("chat"), "a")

    assert labels(target, TargetReading(in_flight=1)) == ["Active"]


def test_the_page_shows_each_targets_state_and_load(teammate: Client) -> None:
    pool = make_pool("chat", name="Chat models")
    fast = make_target(pool, "fast", capacity_weight=8)
    slow = make_target(pool, "slow", state=TargetState.DRAINED)
    sick = make_target(pool, "sick", health=TargetHealth.UNHEALTHY)

    response = teammate.get("/pools/chat/")
    page = response.content.decode()

    assert response.status_code == 200
    assert "Active" in status_of(page, fast)
    assert "Drained" in status_of(page, slow)
    assert "Unhealthy" in status_of(page, sick)
    assert '<td class="num">0 / 8</td>' in page
    assert 'ws-connect="/ws/pools/chat/"' in page
    # A viewer sees no buttons that would only be refused.
    assert "Drain pool" not in page
    assert "/drain/" not in page


def test_an_operator_drains_and_resumes_a_target(operator: Client, simulator_url: str) -> None:
    pool = make_pool("chat")
    target = make_target(pool, "a", base_url=simulator_url)

    response = operator.post(f"/pools/chat/targets/{target.pk}/drain/", follow=True)
    target.refresh_from_db()
    assert target.state == TargetState.DRAINING
    assert "a is draining: it takes no new requests." in response.content.decode()

    response = operator.post(f"/pools/chat/targets/{target.pk}/resume/", follow=True)
    target.refresh_from_db()
    assert target.state == TargetState.ACTIVE
    assert "a is active again." in response.content.decode()


def test_resume_refuses_an_unhealthy_target_with_the_reason(operator: Client) -> None:
    pool = make_pool("chat")
    target = make_target(pool, "a", state=TargetState.DRAINED, health=TargetHealth.UNHEALTHY)

    response = operator.post(f"/pools/chat/targets/{target.pk}/resume/", follow=True)

    target.refresh_from_db()
    assert target.state == TargetState.DRAINED
    assert "Not resumed: a fails its health probes." in response.content.decode()


def test_resume_refuses_a_target_whose_node_is_offline(operator: Client) -> None:
    node = make_node("gpu-1", status=NodeStatus.OFFLINE)
    pool = make_pool("chat")
    target = Target.objects.create(
        pool=pool, name="a", node=node, model_id="m", state=TargetState.DRAINED
    )

    response = operator.post(f"/pools/chat/targets/{target.pk}/resume/", follow=True)

    assert "Not resumed: a&#x27;s node gpu-1 is offline." in response.content.decode()


def test_the_whole_pool_drains_and_resumes_what_may(operator: Client, simulator_url: str) -> None:
    pool = make_pool("chat")
    good = make_target(pool, "good", base_url=simulator_url)
    sick = make_target(pool, "sick", base_url=simulator_url, health=TargetHealth.UNHEALTHY)

    operator.post("/pools/chat/drain/")
    states = dict(pool.targets.values_list("name", "state"))
    assert states == {"good": TargetState.DRAINING, "sick": TargetState.DRAINING}

    page = operator.post("/pools/chat/resume/", follow=True).content.decode()
    good.refresh_from_db()
    sick.refresh_from_db()
    assert (good.state, sick.state) == (TargetState.ACTIVE, TargetState.DRAINING)
    assert "Resumed: good." in page
    assert "Not resumed: sick fails its health probes." in page


def test_a_viewer_may_not_drain(teammate: Client) -> None:
    target = make_target(make_pool("chat"), "a")

    assert teammate.post(f"/pools/chat/targets/{target.pk}/drain/").status_code == 403
    assert teammate.post("/pools/chat/drain/").status_code == 403


def test_a_project_member_drains_their_pool() -> None:
    member = make_user("member")
    add_member(Project.objects.get_or_create(name=DEFAULT_PROJECT)[0], member, Role.MEMBER)
    client = Client()
    client.force_login(member)
    target = make_target(make_pool("chat"), "a")

    assert client.post(f"/pools/chat/targets/{target.pk}/drain/").status_code == 302
    target.refresh_from_db()
    assert target.state == TargetState.DRAINING


def test_the_live_card_is_the_pages_own_partial(teammate: Client) -> None:
    pool = make_pool("chat")
    make_target(pool, "a")

    page = teammate.get("/pools/chat/").content.decode()
    pushed = pool_views.pool_live("chat", can_manage=False)

    assert pushed.lstrip().startswith('<section class="card" id="pool-live" hx-swap-oob="true">')
    first = page.split('<section class="card" id="pool-live">', 1)[1].split("</section>", 1)[0]
    assert first == pushed.split('hx-swap-oob="true">', 1)[1].split("</section>", 1)[0]


def test_an_operator_edits_a_targets_priority_capacity_and_enabled_in_place(
    operator: Client,
) -> None:
    target = make_target(make_pool("chat"), "a", priority=1, capacity_weight=4)
    prefix = f"target-{target.pk}"

    page = operator.get("/pools/chat/").content.decode()
    assert f'name="{prefix}-capacity_weight" value="4"' in page

    response = operator.post(
        f"/pools/chat/targets/{target.pk}/",
        {f"{prefix}-priority": "2", f"{prefix}-capacity_weight": "9"},
        follow=True,
    )

    target.refresh_from_db()
    assert (target.priority, target.capacity_weight, target.enabled) == (2, 9, False)
    assert "a saved." in response.content.decode()


def test_a_bad_capacity_is_refused_with_the_reason(operator: Client) -> None:
    target = make_target(make_pool("chat"), "a", capacity_weight=4)
    prefix = f"target-{target.pk}"

    response = operator.post(
        f"/pools/chat/targets/{target.pk}/",
        {f"{prefix}-priority": "1", f"{prefix}-capacity_weight": "0", f"{prefix}-enabled": "on"},
        follow=True,
    )

    target.refresh_from_db()
    assert target.capacity_weight == 4
    assert "a not saved: Capacity weight: Ensure this value is greater than or equal to 1." in (
        response.content.decode()
    )


def test_an_operator_adds_a_provider_target_whose_key_is_never_shown(operator: Client) -> None:
    make_pool("chat", name="Chat")
    key = "sk-provider-secret-123456"

    response = operator.post(
        "/pools/chat/targets/add/",
        {
            "name": "openai",
            "base_url": "https://api.openai.com/v1",
            "model_id": "gpt-4o-mini",
            "kinds": ["chat", "embeddings"],
            "priority": "2",
            "capacity_weight": "16",
            "credential": key,
        },  # fmt: skip
        follow=True,
    )

    target = Target.objects.get(name="openai")
    assert (target.kinds, target.priority, target.get_credential()) == (
        ["chat", "embeddings"], 2, key,
    )  # fmt: skip
    assert key not in response.content.decode()
    assert "openai added to Chat." in response.content.decode()


def test_a_taken_name_is_refused_on_its_field_and_the_key_is_not_echoed(
    operator: Client,
) -> None:
    make_target(make_pool("chat", name="Chat"), "openai")

    response = operator.post(
        "/pools/chat/targets/add/",
        {"name": "openai", "base_url": "https://x.example/v1", "model_id": "m",
         "kinds": ["chat"], "priority": "1", "capacity_weight": "4", "credential": "sk-typed"},
    )  # fmt: skip

    assert response.status_code == 400
    assert "Chat has a target named openai already." in response.content.decode()
    assert "sk-typed" not in response.content.decode()


def test_an_operator_removes_a_target_after_confirming(operator: Client) -> None:
    target = make_target(make_pool("chat"), "a")

    confirm = operator.get(f"/pools/chat/targets/{target.pk}/remove/").content.decode()
    assert "requests in flight to it finish" in confirm
    operator.post(f"/pools/chat/targets/{target.pk}/remove/")

    assert not Target.objects.filter(pk=target.pk).exists()


def test_an_operator_edits_the_pool_settings(operator: Client) -> None:
    pool = make_pool("chat", name="Chat")
    form = {
        "name": "Chat", "description": "", "strategy": "least_busy", "max_queue": "10",
        "max_queue_wait_s": "5", "max_attempts": "3", "first_byte_timeout_s": "20",
        "first_token_timeout_s": "30", "stream_idle_timeout_s": "15",
        "max_ejection_percent": "50", "continuity_enabled": "", "continuity_threshold": "0.25",
        "history_retention_days": "7", "history_max_rows": "5000",
    }  # fmt: skip

    response = operator.post("/pools/chat/settings/", form, follow=True)

    pool.refresh_from_db()
    assert (pool.strategy, pool.max_queue, pool.max_attempts, pool.continuity_enabled) == (
        "least_busy", 10, 3, False,
    )  # fmt: skip
    assert (pool.first_byte_timeout_s, pool.history_retention_days) == (20.0, 7)
    assert "Chat&#x27;s settings saved." in response.content.decode()


def test_a_viewer_may_not_edit(teammate: Client) -> None:
    target = make_target(make_pool("chat"), "a")

    assert teammate.get("/pools/chat/settings/").status_code == 403
    assert teammate.get("/pools/chat/targets/add/").status_code == 403
    assert teammate.post(f"/pools/chat/targets/{target.pk}/").status_code == 403
    assert teammate.post(f"/pools/chat/targets/{target.pk}/remove/").status_code == 403


def test_the_dry_run_ranks_every_tier_and_explains_each_skip(teammate: Client) -> None:
    pool = make_pool("chat", strategy="smart")
    make_target(pool, "a", priority=1, capacity_weight=4)
    make_target(pool, "b", priority=1, capacity_weight=4, state=TargetState.DRAINED)
    make_target(pool, "c", priority=2, capacity_weight=8)
    make_target(pool, "d", priority=2, kinds=["embeddings"])

    response = teammate.get("/pools/chat/dry-run/?kind=chat", headers={"HX-Request": "true"})
    result = response.content.decode()

    assert result.lstrip().startswith('<div id="dry-run-result"')
    assert "Would go to <strong data-chosen>a</strong> (tier 1)." in result
    assert "Nothing was routed." in result
    tier_2 = result.split('data-tier="2"', 1)[1]
    assert '<tr data-target="c">' in tier_2
    assert "Skipped: <strong>incompatible</strong> — " in tier_2
    tier_1 = result.split('data-tier="1"', 1)[1].split('data-tier="2"', 1)[0]
    assert "Skipped: <strong>drained</strong>" in tier_1
    assert "<strong>utilization</strong>" in tier_1


def test_the_dry_run_api_lists_every_tier(owner) -> None:
    pool = make_pool("chat")
    make_target(pool, "a", priority=1)
    make_target(pool, "c", priority=2)

    tiers = owner.post("/api/v1/pools/chat/dry-run/", {"kind": "chat"}, format="json").json()[
        "tiers"
    ]

    assert [(tier["tier"], [r["name"] for r in tier["ranking"]]) for tier in tiers] == [
        (1, ["a"]),
        (2, ["c"]),
    ]


@pytest.mark.parametrize("targets", [2, 20])
def test_the_pool_page_costs_a_fixed_number_of_queries(
    operator: Client, django_assert_num_queries, targets: int
) -> None:
    pool = make_pool("chat")
    for n in range(targets):
        make_target(pool, f"t{n}", node=make_node(f"n{n}") if n % 2 else None, model_id="m")
    ApiToken.issue("a token")

    # Session, user, the pool with its project, the caller's tokens, the targets with their nodes,
    # its latest identity confirmation, its latest drills:
    # the same for 2 targets as for 20 (the live state comes from Redis, not the database).
    with django_assert_num_queries(7):
        response = operator.get("/pools/chat/")
    assert response.status_code == 200
