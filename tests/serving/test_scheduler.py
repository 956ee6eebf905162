"""The scheduler: which node a replica goes to, and why none when it cannot go anywhere."""

from __future__ import annotations

from typing import Any

import pytest

from serving.scheduler import Candidate, Need, Placement, Schedule, schedule

GIB = 1 << 30


def free(cpu: float, gib: float, gpus: tuple[int, ...] = ()) -> dict[str, Any]:
    """Return free slots as an agent reports them."""
    return {
        "cpu_count": cpu,
        "memory_bytes": int(gib * GIB),
        "gpus": [{"index": index, "name": "H100", "memory_bytes": 80 * GIB} for index in gpus],
    }


def node(name: str, cpu: float = 8, gib: float = 32, routes: int = 0, **extra: Any) -> Candidate:
    return Candidate(name, free(cpu, gib, extra.pop("gpus", ())), routes, **extra)


SMALL = Need(cpu=1, memory_bytes=2 * GIB)


@pytest.mark.parametrize(
    ("replicas", "nodes", "need", "expected"),
    [
        pytest.param(2, [node("a"), node("b")], SMALL, ["a", "b"], id="spreads over equal nodes"),
        pytest.param(
            1, [node("a", routes=1), node("b", routes=0)], SMALL, ["b"], id="fewest routes first"
        ),
        pytest.param(
            1, [node("a", gib=16), node("b", gib=64)], SMALL, ["b"], id="then most free memory"
        ),
        pytest.param(1, [node("b"), node("a")], SMALL, ["a"], id="then the name"),
        pytest.param(
            3,
            [node("a", gib=64), node("b", gib=4)],
            SMALL,
            ["a", "b", "a"],
            id="replicas placed count against their node",
        ),
        pytest.param(
            3,
            [node("a", cpu=2), node("b", cpu=0.5)],
            SMALL,
            ["a", "a"],
            id="stops when nothing fits",
        ),
        pytest.param(1, [node("a", cpu=0, gib=0)], Need(), ["a"], id="a zero need fits"),
        pytest.param(
            2,
            [node("a"), node("b")],
            Need(cpu=1, port=8000),
            ["a", "b"],
            id="a fixed port once per node",
        ),
    ],
)
def test_it_places_replicas(
    replicas: int, nodes: list[Candidate], need: Need, expected: list[str]
) -> None:
    decision = schedule(replicas, nodes, need, "default")

    assert [placement.node for placement in decision.placements] == expected


def test_it_reserves_whole_free_gpus_lowest_index_first() -> None:
    nodes = [node("gpu-a", gpus=(1, 3)), node("gpu-b", gpus=(0,), routes=1)]

    decision = schedule(
        3, nodes, Need.from_slots({"cpu": 1, "mem": "4g", "cuda.shares": 0.5}), "gpu"
    )

    assert decision.placements == (
        Placement("gpu-a", (1,)),
        Placement("gpu-b", (0,)),
        Placement("gpu-a", (3,)),
    )
    assert decision.reason == ""


def test_a_fixed_port_taken_on_a_node_keeps_replicas_off_it() -> None:
    nodes = [node("a", ports_in_use=frozenset({8000})), node("b", gib=1)]

    decision = schedule(1, nodes, Need(port=8000), "default")

    assert decision.placements == (Placement("b"),)


@pytest.mark.parametrize(
    ("nodes", "need", "reason"),
    [
        pytest.param(
            [node("gpu-a", cpu=1, gib=8), node("gpu-b", cpu=0.5, gib=2)],
            Need(cpu=2, memory_bytes=4 * GIB),
            "insufficient resources in default: needs 2 CPU, 4 GiB; "
            "best node gpu-a has 1 CPU, 8 GiB free",
            id="names the closest node",
        ),
        pytest.param(
            [node("b", cpu=16, gib=64), node("a", cpu=16, gib=64, gpus=(0,))],
            Need(cpu=1, memory_bytes=GIB, gpus=2),
            "insufficient resources in default: needs 1 CPU, 1 GiB, 2 GPUs; "
            "best node a has 16 CPU, 64 GiB, 1 GPU free",
            id="counts GPUs when some are needed",
        ),
        pytest.param(
            [node("a", ports_in_use=frozenset({8000}))],
            Need(cpu=1, port=8000),
            "insufficient resources in default: needs 1 CPU, 0 B, port 8000; "
            "best node a has 8 CPU, 32 GiB free, port 8000 taken",
            id="a taken port",
        ),
        pytest.param(
            [],
            Need(cpu=0.5, memory_bytes=GIB // 2),
            "insufficient resources in default: needs 0.5 CPU, 512 MiB; "
            "no usable node in the group",
            id="no node at all",
        ),
    ],
)
def test_it_says_why_a_replica_fits_nowhere(
    nodes: list[Candidate], need: Need, reason: str
) -> None:
    decision = schedule(1, nodes, need, "default")

    assert decision.placements == ()
    assert decision.reason == reason


def test_it_does_not_change_the_candidates_it_was_given() -> None:
    nodes = [node("a", cpu=2)]

    schedule(2, nodes, SMALL, "default")

    assert nodes[0].cpu == 2
    assert nodes[0].routes == 0


@pytest.mark.parametrize(
    ("slots", "need"),
    [
        ({}, Need()),
        ({"cpu": 2, "mem": 4 * GIB}, Need(cpu=2, memory_bytes=4 * GIB)),
        ({"cpu": 0.5, "mem": "8gb", "cuda.shares": 1.5}, Need(0.5, 8 * GIB, 2)),
        ({"cpu": 1, "mem": "512m", "cuda.shares": 0}, Need(1, 512 << 20, 0)),
    ],
)
def test_it_reads_a_revisions_resource_slots(slots: dict[str, Any], need: Need) -> None:
    assert Need.from_slots(slots) == need


def test_a_multi_node_replica_takes_distinct_nodes_its_main_the_best() -> None:
    nodes = [node("a", 4, 8), node("b", 4, 16), node("c", 4, 12), node("d", 4, 4)]

    decision = schedule(2, nodes, Need(cpu=1, memory_bytes=GIB), "gpu", size=3)

    first, second = decision.placements
    assert (first.node, [worker.node for worker in first.workers]) == ("b", ["c", "a"])
    # The second replica spreads: the nodes with fewest routes of the service first.
    assert (second.node, [worker.node for worker in second.workers]) == ("d", ["b", "c"])
    assert decision.reason == ""


def test_a_multi_node_replica_is_placed_whole_or_not_at_all() -> None:
    nodes = [node("a", 4, 8), node("b", 4, 8), node("c", 0.5, 8)]

    decision = schedule(1, nodes, Need(cpu=1), "default", size=3)

    assert decision.placements == ()
    assert decision.reason == (
        "insufficient resources in default: a replica spans 3 nodes that each have "
        "1 CPU, 0 B free; 2 of 3 usable nodes do"
    )


REFUSAL = "refused route 7: /srv is outside the directories this agent may use (/data)"


def test_a_node_that_refused_the_revision_is_left_out() -> None:
    decision = schedule(1, [node("a", gib=64, refused=REFUSAL), node("b")], SMALL, "default")

    assert decision == Schedule(placements=(Placement("b"),))


def test_the_reason_names_the_node_that_refused_and_until_when() -> None:
    nodes = [node("a", refused=REFUSAL), node("b", cpu=0.5)]

    decision = schedule(1, nodes, SMALL, "default")

    assert decision.placements == ()
    assert decision.reason == (
        "insufficient resources in default: needs 1 CPU, 2 GiB; best node b has 0.5 CPU,"
        f" 32 GiB free; node a {REFUSAL} (not chosen again until its configuration changes)"
    )


def test_when_every_node_refused_the_reason_lists_the_refusals() -> None:
    decision = schedule(1, [node("a", refused=REFUSAL)], SMALL, "default")

    assert decision.placements == ()
    assert decision.reason == (
        "insufficient resources in default: needs 1 CPU, 2 GiB; node a "
        f"{REFUSAL} (not chosen again until its configuration changes)"
    )
