"""A service's managed pool follows its routes: a target per serving replica, and no more."""

from __future__ import annotations

import pytest

from nexus.models import ConfigVersion
from nodes.models import Node, NodeStatus, NodeTrust
from pools import services as pool_services
from pools.models import Pool, Target, TargetHealth, TargetState
from serving import reconciler
from serving.models import ModelFolder, ProbeResult, Route, RouteState, Service
from serving.pool_sync import drop_service_pool, sync_service_pool
from tests.serving.fleet import make_service


@pytest.fixture
def node(db: None) -> Node:
    return Node.objects.create(
        name="gpu-1",
        address="http://127.0.0.1:9",
        trust=NodeTrust.TRUSTED,
        status=NodeStatus.ONLINE,
    )


@pytest.fixture
def service(db: None) -> Service:
    return make_service(ModelFolder.objects.create(name="tiny"), capacity=3)


def route(service: Service, node: Node, state: str, process_id: str, **fields: object) -> Route:
    return Route.objects.create(
        service=service,
        revision=service.latest_revision,
        node=node,
        process_id=process_id,
        state=state,
        **fields,
    )


def test_each_healthy_route_gets_a_target_at_its_process_on_the_agent(
    service: Service, node: Node
) -> None:
    serving = route(service, node, RouteState.HEALTHY, "p-1")
    degraded = route(service, node, RouteState.HEALTHY, "p-2", probe_result=ProbeResult.FAILED)
    route(service, node, RouteState.PROVISIONING, "p-3")
    route(service, node, RouteState.UNHEALTHY, "p-4")

    sync_service_pool(service)

    pool = Pool.objects.get(slug="chat")
    assert (pool.name, pool.managed, pool.compatibility_mode) == ("chat", True, "exact_replicas")
    service.refresh_from_db()
    assert service.pool == pool
    targets = list(
        # By route: names sort as text ("route-10" before "route-9").
        pool.targets.order_by("route__pk").values_list(
            "name", "base_url", "node__name", "model_id", "capacity_weight", "health", "state"
        )
    )
    assert targets == [
        (
            f"route-{serving.pk}",
            "http://127.0.0.1:9/agent/v1/processes/p-1/http",
            "gpu-1",
            "tiny",
            3,
            TargetHealth.HEALTHY,
            TargetState.ACTIVE,
        ),
        (
            f"route-{degraded.pk}",
            "http://127.0.0.1:9/agent/v1/processes/p-2/http",
            "gpu-1",
            "tiny",
            3,
            TargetHealth.DEGRADED,
            TargetState.ACTIVE,
        ),
    ]
    serving.refresh_from_db()
    assert serving.target.name == f"route-{serving.pk}"


def test_the_configuration_version_moves_only_when_a_target_changes(
    service: Service, node: Node
) -> None:
    serving = route(service, node, RouteState.HEALTHY, "p-1")
    sync_service_pool(service)
    version = ConfigVersion.current()

    sync_service_pool(service)
    assert ConfigVersion.current() == version

    Route.objects.filter(pk=serving.pk).update(probe_result=ProbeResult.FAILED)
    sync_service_pool(service)
    assert ConfigVersion.current() > version
    assert Target.objects.get().health == TargetHealth.DEGRADED


def test_a_draining_route_keeps_its_target_draining_until_it_ends(
    service: Service, node: Node
) -> None:
    leaving = route(service, node, RouteState.HEALTHY, "p-1")
    sync_service_pool(service)

    Route.objects.filter(pk=leaving.pk).update(state=RouteState.TERMINATING)
    sync_service_pool(service)
    target = Target.objects.get()
    assert target.state == TargetState.DRAINING
    assert not pool_services.drain_finished(target.pk, grace_s=60)
    assert pool_services.drain_finished(target.pk, grace_s=0)

    Route.objects.filter(pk=leaving.pk).update(state=RouteState.TERMINATED)
    sync_service_pool(service)
    assert not Target.objects.exists()
    leaving.refresh_from_db()
    assert leaving.target is None


def test_a_managed_target_keeps_its_url_when_its_node_is_saved(
    service: Service, node: Node
) -> None:
    route(service, node, RouteState.HEALTHY, "p-1")
    sync_service_pool(service)

    node.save()

    assert Target.objects.get().base_url == "http://127.0.0.1:9/agent/v1/processes/p-1/http"


def test_dropping_the_pool_removes_its_targets(service: Service, node: Node) -> None:
    route(service, node, RouteState.HEALTHY, "p-1")
    sync_service_pool(service)

    drop_service_pool(service)

    assert not Pool.objects.filter(slug="chat").exists()
    assert not Target.objects.exists()


# The pool's target address is reached (a closed loopback port).
@pytest.mark.live
def test_an_operators_pool_of_the_same_name_is_never_taken_over(
    service: Service, node: Node
) -> None:
    Pool.objects.create(slug="chat", name="Chat (by hand)")
    route(service, node, RouteState.HEALTHY, "p-1")

    assert reconciler.reconcile(service) == "ok"

    service.refresh_from_db()
    assert service.pool is None
    assert service.status_message.endswith(
        "cannot serve: the pool chat exists and belongs to no service; rename it"
    )
    assert not Target.objects.exists()
