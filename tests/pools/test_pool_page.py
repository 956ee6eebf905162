"""A pool's page tells the truth about each target: state, health, its node, load; operators
drain and resume targets and the whole pool from it, and resume refuses a target that is not
healthy."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.test import Client

from nexus.models import DEFAULT_PROJECT, Project, Role
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
