"""What this machine has (CPUs, memory, NVIDIA GPUs) and what running processes leave free."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

import psutil

logger = logging.getLogger(__name__)

NVIDIA_SMI_QUERY = (
    "--query-gpu=index,name,memory.total",
    "--format=csv,noheader,nounits",
)
# nvidia-smi can hang on a wedged driver; the agent must start regardless.
NVIDIA_SMI_TIMEOUT_S = 5.0
MIB = 1024 * 1024


def parse_nvidia_smi(output: str) -> list[dict[str, Any]]:
    """Return the GPUs of `nvidia-smi --query-gpu=index,name,memory.total` CSV (MiB) output."""
    gpus = []
    for line in output.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3:
            continue
        index, name, memory_mib = fields
        try:
            gpus.append({"index": int(index), "name": name, "memory_bytes": int(memory_mib) * MIB})
        except ValueError:
            continue
    return gpus


async def detect_gpus() -> list[dict[str, Any]]:
    """Return the NVIDIA GPUs nvidia-smi reports, or none when it is absent or fails."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return []
    try:
        process = await asyncio.create_subprocess_exec(
            binary,
            *NVIDIA_SMI_QUERY,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as error:
        logger.warning("cannot run nvidia-smi: %s", error)
        return []
    try:
        output, _ = await asyncio.wait_for(process.communicate(), NVIDIA_SMI_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        logger.warning(
            "nvidia-smi did not answer within %s s; reporting no GPUs", NVIDIA_SMI_TIMEOUT_S
        )
        return []
    if process.returncode != 0:
        return []
    return parse_nvidia_smi(output.decode(errors="replace"))


def machine_resources(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the machine's totals: CPU count, memory bytes and GPUs."""
    return {
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": psutil.virtual_memory().total,
        "gpus": gpus,
    }


def reserved_gpu_indexes(reserved: object) -> set[int]:
    """Return the GPU indexes a process reserved: a list of indexes or of `{"index": ...}`."""
    if not isinstance(reserved, list):
        return set()
    indexes = set()
    for gpu in reserved:
        if isinstance(gpu, Mapping):
            gpu = gpu.get("index")
        if isinstance(gpu, int) and not isinstance(gpu, bool):
            indexes.add(gpu)
    return indexes


def free_resources(
    total: Mapping[str, Any], reservations: Iterable[Mapping[str, Any] | None]
) -> dict[str, Any]:
    """Return the totals less what the running processes reserved (never below zero)."""
    cpu_count = total["cpu_count"]
    memory_bytes = total["memory_bytes"]
    taken_gpus: set[int] = set()
    for reserved in reservations:
        if not reserved:
            continue
        cpu_count -= _number(reserved.get("cpu_count"))
        memory_bytes -= _number(reserved.get("memory_bytes"))
        taken_gpus |= reserved_gpu_indexes(reserved.get("gpus"))
    return {
        "cpu_count": max(cpu_count, 0),
        "memory_bytes": max(memory_bytes, 0),
        "gpus": [gpu for gpu in total["gpus"] if gpu["index"] not in taken_gpus],
    }


def _number(value: object) -> int | float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return 0
