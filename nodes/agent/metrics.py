"""Node and per-process usage, sampled in the background so a request never waits for psutil.

Per-process network traffic is not reported: the kernel counts bytes per network interface, not
per process, so psutil has only the node's totals (from which the node's rates are derived).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

SAMPLE_INTERVAL_S = 2.0


@dataclass
class _Tracked:
    """psutil handles kept between samples: cpu_percent() measures since the previous call."""

    root: psutil.Process
    children: dict[int, psutil.Process] = field(default_factory=dict)


class MetricsSampler:
    """Sample node and managed-process usage every couple of seconds; serve the latest sample."""

    def __init__(
        self,
        running: Callable[[], list[dict[str, Any]]],
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        self._running = running
        self._interval_s = interval_s
        self._tracked: dict[str, _Tracked] = {}
        self._last_net: tuple[float, int, int] | None = None
        self._task: asyncio.Task[None] | None = None
        self.latest: dict[str, Any] = {
            "node": {
                "cpu_percent": 0.0,
                "memory_used_bytes": 0,
                "memory_total_bytes": psutil.virtual_memory().total,
                "net_rx_bytes_per_s": 0.0,
                "net_tx_bytes_per_s": 0.0,
            },
            "processes": [],
        }

    async def start(self) -> None:
        """Take the first sample (it primes the CPU and network counters), then keep sampling."""
        await self.sample()
        self._task = asyncio.create_task(self._sample_forever())

    async def close(self) -> None:
        """Stop sampling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.sample()

    async def sample(self) -> None:
        """Take one sample; psutil's reads of /proc run in a thread, off the event loop."""
        processes = [(p["id"], p["pid"]) for p in self._running() if p.get("pid")]
        self.latest = await asyncio.to_thread(self._measure, processes)

    def _measure(self, processes: Sequence[tuple[str, int]]) -> dict[str, Any]:
        memory = psutil.virtual_memory()
        now = time.monotonic()
        net = psutil.net_io_counters()
        rx_rate = tx_rate = 0.0
        if self._last_net is not None:
            then, rx, tx = self._last_net
            elapsed = max(now - then, 1e-6)
            # Counters can wrap or reset (an interface going away); a negative rate means that.
            rx_rate = max(net.bytes_recv - rx, 0) / elapsed
            tx_rate = max(net.bytes_sent - tx, 0) / elapsed
        self._last_net = (now, net.bytes_recv, net.bytes_sent)
        return {
            "node": {
                "cpu_percent": psutil.cpu_percent(interval=None),
                "memory_used_bytes": memory.total - memory.available,
                "memory_total_bytes": memory.total,
                "net_rx_bytes_per_s": round(rx_rate, 1),
                "net_tx_bytes_per_s": round(tx_rate, 1),
            },
            "processes": self._measure_processes(processes),
        }

    def _measure_processes(self, processes: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
        """Return CPU % and resident memory of each process with its children (runtimes fork)."""
        measured = []
        live_ids = set()
        for process_id, pid in processes:
            tracked = self._tracked.get(process_id)
            if tracked is None or tracked.root.pid != pid:
                try:
                    tracked = _Tracked(psutil.Process(pid))
                except psutil.Error:
                    continue
                self._tracked[process_id] = tracked
            live_ids.add(process_id)
            cpu_percent, memory_bytes = _usage(tracked)
            measured.append(
                {
                    "id": process_id,
                    "pid": pid,
                    "cpu_percent": round(cpu_percent, 1),
                    "memory_bytes": memory_bytes,
                }
            )
        for gone in set(self._tracked) - live_ids:
            del self._tracked[gone]
        return measured


def _usage(tracked: _Tracked) -> tuple[float, int]:
    """Return the summed CPU % (since the last call) and RSS of a process tree."""
    try:
        children = tracked.root.children(recursive=True)
    except psutil.Error:
        children = []
    # Keep the handles of children seen before: a new handle's first cpu_percent() reads 0.
    # (psutil handles compare equal only for the same pid and start time, so a reused pid
    # gets a fresh handle.)
    kept = tracked.children
    tracked.children = {
        child.pid: kept[child.pid] if kept.get(child.pid) == child else child for child in children
    }
    cpu_percent = 0.0
    memory_bytes = 0
    for process in (tracked.root, *tracked.children.values()):
        try:
            with process.oneshot():
                cpu_percent += process.cpu_percent(interval=None)
                memory_bytes += process.memory_info().rss
        except psutil.Error:
            continue
    return cpu_percent, memory_bytes
