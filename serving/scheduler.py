"""Choose nodes for replicas: pure, given what each candidate node has free.

The reconciler gathers the facts (the group's usable nodes, what their agents report free, how
many routes of the service each runs, the ports taken) and applies the decision. Replicas placed
in one call count against the nodes they were put on, so a tick never over-fills a node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nexus.ui.format import binary_size
from serving.definitions.service_definition import parse_memory


@dataclass(frozen=True)
class Need:
    """What one replica reserves: CPUs, memory bytes, whole GPUs, and a fixed port if any."""

    cpu: float = 0.0
    memory_bytes: int = 0
    gpus: int = 0
    port: int | None = None

    @classmethod
    def from_slots(cls, slots: Mapping[str, Any], port: int | None = None) -> Need:
        """Return the need of a revision's resource slots {"cpu", "mem", "cuda.shares"}.

        `mem` may be bytes or a size like "8gb"; a fraction of a GPU reserves a whole one,
        because the agent hands out GPUs by index.
        """
        mem = slots.get("mem") or 0
        return cls(
            cpu=float(slots.get("cpu") or 0),
            memory_bytes=parse_memory(mem) if isinstance(mem, str) else int(mem),
            gpus=math.ceil(float(slots.get("cuda.shares") or 0)),
            port=port,
        )

    def describe(self) -> str:
        """Return the need in words, e.g. "2 CPU, 4 GiB, 1 GPU"."""
        parts = [f"{self.cpu:g} CPU", binary_size(self.memory_bytes)]
        if self.gpus:
            parts.append(_gpus(self.gpus))
        if self.port is not None:
            parts.append(f"port {self.port}")
        return ", ".join(parts)


@dataclass
class Candidate:
    """A usable node of the group, as its agent reported it: `free` is the agent's `free`."""

    name: str
    free: Mapping[str, Any]
    routes: int = 0  # routes of this service on the node already
    ports_in_use: frozenset[int] = frozenset()
    # Why the node refused a route of this revision for a path or resource reason, while its
    # configuration is unchanged since: it is not chosen again ("" when it did not).
    refused: str = ""

    @property
    def cpu(self) -> float:
        return float(self.free.get("cpu_count") or 0)

    @property
    def memory_bytes(self) -> int:
        return int(self.free.get("memory_bytes") or 0)

    @property
    def gpu_indexes(self) -> list[int]:
        """Return the free GPUs' indexes (the agent lists GPU objects; bare indexes work too)."""
        indexes = []
        for gpu in self.free.get("gpus") or []:
            index = gpu.get("index") if isinstance(gpu, Mapping) else gpu
            if isinstance(index, int) and not isinstance(index, bool):
                indexes.append(index)
        return sorted(indexes)

    def shortfalls(self, need: Need) -> int:
        """Return how many of the need's dimensions this node cannot meet."""
        return sum(
            (
                self.cpu < need.cpu,
                self.memory_bytes < need.memory_bytes,
                len(self.gpu_indexes) < need.gpus,
                need.port is not None and need.port in self.ports_in_use,
                bool(self.refused),
            )
        )

    def describe_free(self, need: Need) -> str:
        """Return what the node has free, in the terms the need is stated in."""
        parts = [f"{self.cpu:g} CPU", binary_size(self.memory_bytes)]
        if need.gpus:
            parts.append(_gpus(len(self.gpu_indexes)))
        text = ", ".join(parts) + " free"
        if need.port is not None and need.port in self.ports_in_use:
            text += f", port {need.port} taken"
        return text


@dataclass(frozen=True)
class Placement:
    """One replica's node, and the GPUs it reserves there; a multi-node replica's workers
    (ranks 1 …) are on other nodes, each a placement of its own."""

    node: str
    gpus: tuple[int, ...] = ()
    workers: tuple[Placement, ...] = ()


@dataclass(frozen=True)
class Schedule:
    """Where the replicas go, in order; `reason` says why the rest could not be placed."""

    placements: tuple[Placement, ...] = ()
    reason: str = ""


def schedule(
    replicas: int, candidates: Sequence[Candidate], need: Need, group: str, size: int = 1
) -> Schedule:
    """Place `replicas` replicas, each on the node that fits and spreads them best.

    Spread: fewest routes of this service first, then most free memory, then the name, so equal
    nodes are chosen in a stable order. Placed replicas reduce their node's free slots. A
    multi-node replica (`size` above 1) takes `size` distinct nodes that each fit the need,
    the best one its main, or none at all.
    """
    nodes = [replace(c, free=dict(c.free)) for c in candidates]
    placements: list[Placement] = []
    for _ in range(replicas):
        fitting = sorted(
            (node for node in nodes if node.shortfalls(need) == 0),
            key=lambda node: (node.routes, -node.memory_bytes, node.name),
        )
        if len(fitting) < size:
            break
        parts = []
        for chosen in fitting[:size]:
            gpus = tuple(chosen.gpu_indexes[: need.gpus])
            _reserve(chosen, need, gpus)
            parts.append(Placement(chosen.name, gpus))
        main, *workers = parts
        placements.append(Placement(main.node, main.gpus, tuple(workers)))
    if len(placements) == replicas:
        return Schedule(placements=tuple(placements))
    if size > 1:
        reason = insufficient_cluster(group, need, size, nodes)
    else:
        reason = insufficient(group, need, nodes)
    return Schedule(placements=tuple(placements), reason=reason)


def insufficient_cluster(group: str, need: Need, size: int, nodes: Sequence[Candidate]) -> str:
    """Return why a multi-node replica does not fit: how many distinct nodes fit its need."""
    fitting = sum(node.shortfalls(need) == 0 for node in nodes)
    return (
        f"insufficient resources in {group}: a replica spans {size} nodes that each have "
        f"{need.describe()} free; {fitting} of {len(nodes)} usable nodes do"
    )


def insufficient(group: str, need: Need, nodes: Sequence[Candidate]) -> str:
    """Return why no node fits, naming the node that came closest and what it has free."""
    head = f"insufficient resources in {group}: needs {need.describe()}"
    refusals = "".join(f"; node {node.name} {node.refused}" for node in nodes if node.refused)
    if refusals:
        refusals += " (not chosen again until its configuration changes)"
    willing = [node for node in nodes if not node.refused]
    if not willing:
        return f"{head}; no usable node in the group{refusals}" if not nodes else head + refusals
    best = min(
        willing,
        key=lambda node: (node.shortfalls(need), -node.memory_bytes, -node.cpu, node.name),
    )
    return f"{head}; best node {best.name} has {best.describe_free(need)}{refusals}"


def _reserve(node: Candidate, need: Need, gpus: tuple[int, ...]) -> None:
    """Take one replica's share out of the node's free slots."""
    free = dict(node.free)
    free["cpu_count"] = node.cpu - need.cpu
    free["memory_bytes"] = node.memory_bytes - need.memory_bytes
    free["gpus"] = [
        gpu
        for gpu in free.get("gpus") or []
        if (gpu.get("index") if isinstance(gpu, Mapping) else gpu) not in gpus
    ]
    node.free = free
    node.routes += 1
    if need.port is not None:
        node.ports_in_use = node.ports_in_use | {need.port}


def slots_text(slots: Mapping[str, Any]) -> str:
    """Return resource slots in words, e.g. "2 CPU, 256 MiB, 0.5 GPU"; no GPU part when none
    is reserved, "nothing reserved" for no slots."""
    if not slots:
        return "nothing reserved"
    mem = slots.get("mem") or 0
    parts = [
        f"{float(slots.get('cpu') or 0):g} CPU",
        binary_size(parse_memory(mem) if isinstance(mem, str) else mem),
    ]
    shares = float(slots.get("cuda.shares") or 0)
    if shares:
        parts.append(f"{shares:g} GPU")
    return ", ".join(parts)


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"
