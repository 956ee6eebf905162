"""The models this node serves: its running managed processes' and its watched runtimes'."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from nodes.agent.processes import ServedModel

logger = logging.getLogger(__name__)

# A runtime that takes longer than this to list its models is reported without them (watched)
# or with state "unknown" (managed); the inventory route must stay quick.
MODELS_TIMEOUT_S = 2.0
# How stale the watched runtimes' model lists may be when forwarding looks a model up.
WATCHED_CACHE_S = 2.0

# Runtime-reported states mapped onto the contract's loaded | warm | cold | unknown. "warm": on
# its way or quick to wake (loading, vLLM's sleep mode); "cold": it has to load first.
_STATES = {
    "loaded": "loaded",
    "ready": "loaded",
    "running": "loaded",
    "active": "loaded",
    "warm": "warm",
    "loading": "warm",
    "sleeping": "warm",
    "cold": "cold",
    "unloaded": "cold",
    "idle": "cold",
}
# `owned_by` values of known runtimes' /v1/models entries.
_OWNERS = {
    "llamacpp": "llama-cpp",
    "llama.cpp": "llama-cpp",
    "vllm": "vllm",
    "sglang": "sglang",
    "nexus-simulator": "simulator",
}
OLLAMA_PORT = 11434

ServedModels = Callable[[], Sequence[ServedModel]]


def reported_state(entry: Mapping[str, Any]) -> str:
    """Return the state a runtime reports for one /v1/models entry, or "unknown"."""
    value = entry.get("state", entry.get("status"))
    if isinstance(value, Mapping):  # llama.cpp's router: "status": {"value": "loaded", ...}
        value = value.get("value")
    if not isinstance(value, str):
        return "unknown"
    return _STATES.get(value.lower(), "unknown")


def guess_runtime(entry: Mapping[str, Any], base_url: str) -> str:
    """Return the runtime a watched model is served by, as far as its entry tells."""
    owner = entry.get("owned_by")
    if isinstance(owner, str) and owner.lower() in _OWNERS:
        return _OWNERS[owner.lower()]
    if urlsplit(base_url).port == OLLAMA_PORT:
        return "ollama"
    return "openai-compatible"


def managed_base_url(port: int) -> str:
    """Return the OpenAI base URL of a managed runtime; runtimes stay bound to loopback."""
    return f"http://127.0.0.1:{port}/v1"


class Inventory:
    """Answer which models this node serves and where each is served."""

    def __init__(
        self, session: aiohttp.ClientSession, served: ServedModels, watch: Sequence[str]
    ) -> None:
        self._session = session
        self._served = served
        self._watch = tuple(watch)
        self._watched: list[dict[str, Any]] = []
        self._watched_at = float("-inf")

    async def models(self) -> list[dict[str, Any]]:
        """Return every model with the state its runtime reports now."""
        managed = self._managed()
        *listings, _ = await asyncio.gather(
            *(self._list_models(model["base_url"]) for model in managed),
            self._refresh_watched(),
        )
        for model, listing in zip(managed, listings, strict=True):
            entry = next((e for e in listing or () if e.get("id") == model["id"]), None)
            if entry is not None:
                model["state"] = reported_state(entry)
        return managed + self._watched

    async def base_url_for(self, model_id: str) -> str | None:
        """Return the base URL of the local runtime serving a model, or None."""
        # Per request: read the process records in place, build nothing.
        for served in self._served():
            if served.model["id"] == model_id:
                return managed_base_url(served.port)
        if time.monotonic() - self._watched_at > WATCHED_CACHE_S:
            await self._refresh_watched()
        for model in self._watched:
            if model["id"] == model_id:
                return model["base_url"]
        return None

    def _managed(self) -> list[dict[str, Any]]:
        models = []
        for process_id, port, model in self._served():
            models.append(
                {
                    "id": model["id"],
                    "runtime": model.get("runtime") or "custom",
                    "base_url": managed_base_url(port),
                    "state": "unknown",
                    "digest": model.get("digest"),
                    "source": "managed",
                    "process_id": process_id,
                }
            )
        return models

    async def _refresh_watched(self) -> None:
        listings = await asyncio.gather(*(self._list_models(url) for url in self._watch))
        watched = []
        for base_url, listing in zip(self._watch, listings, strict=True):
            for entry in listing or ():
                if not isinstance(entry.get("id"), str):
                    continue
                watched.append(
                    {
                        "id": entry["id"],
                        "runtime": guess_runtime(entry, base_url),
                        "base_url": base_url,
                        "state": reported_state(entry),
                        "digest": None,
                        "source": "watched",
                        "process_id": None,
                    }
                )
        self._watched = watched
        self._watched_at = time.monotonic()

    async def _list_models(self, base_url: str) -> list[dict[str, Any]] | None:
        """Return a runtime's /models entries, or None when it does not answer in time."""
        try:
            async with self._session.get(
                f"{base_url}/models", timeout=aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)
            ) as response:
                if response.status != 200:
                    return None
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            logger.debug("%s/models did not answer: %r", base_url, error)
            return None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            return None
        return [entry for entry in data if isinstance(entry, dict)]
