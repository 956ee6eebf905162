"""Real requests through a pool's gateway: Try traffic, and the failure drill.

Both run in a Celery worker (pools.tasks.run_traffic) and write their progress into their
`TrafficRun` row about twice a second; the run's page reads the row. Requests go through the
real gateway (`NEXUS_CONTROLLER_URL`/v1) with a client token issued for this run alone, scoped to
the pool, expiring on its own, and revoked when the run ends. Every run is bounded: at most
`MAX_REQUESTS` requests a phase, `MAX_CONCURRENCY` at once, `MAX_TOKENS` tokens each, and each
request's own timeout. docs/pools-console.md has the drill's phases and verdict.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.utils import timezone

from nexus.models import ApiToken
from pools.models import Pool, Target, TrafficRun, TrafficRunKind, TrafficRunStatus

MAX_REQUESTS = 500
MAX_CONCURRENCY = 32
MAX_TOKENS = 256
REQUEST_TIMEOUT_S = 60.0
TOKEN_LIFETIME = timedelta(minutes=30)
SAVE_EVERY_S = 0.5
# The gateways pick a configuration change up within a second (DESIGN.md); a drill waits this
# long after draining and after resuming, so that each phase measures the new state.
CONFIG_PROPAGATION_S = 1.5
PROMPT = "Say something short about load balancing."
PATHS = {"chat": "/chat/completions", "completions": "/completions", "embeddings": "/embeddings"}


@dataclass(frozen=True)
class Answer:
    """One request's outcome as the client saw it."""

    status: int | None  # None: no answer (connection failed or timed out)
    target: str  # the gateway's X-Nexus-Target, empty when none
    ttft_ms: float | None


def body_of(pool: Pool, params: dict[str, Any]) -> dict[str, Any]:
    """Return a representative request of the asked kind."""
    model = pool.model_name
    kind = params["kind"]
    if kind == "embeddings":
        return {"model": model, "input": PROMPT}
    body: dict[str, Any] = {"model": model, "max_tokens": params["max_tokens"]}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    if params["stream"]:
        body["stream"] = True
    return body


def send_one(client: httpx.Client, url: str, body: dict[str, Any]) -> Answer:
    """Send one request and read its whole answer; the time to its first byte of body is TTFT."""
    began = time.monotonic()
    try:
        with client.stream("POST", url, json=body) as response:
            ttft_ms = None
            for _ in response.iter_bytes():
                if ttft_ms is None:
                    ttft_ms = (time.monotonic() - began) * 1000
            return Answer(response.status_code, response.headers.get("x-nexus-target", ""), ttft_ms)
    except httpx.HTTPError:
        return Answer(None, "", None)


def new_phase(name: str, planned: int) -> dict[str, Any]:
    return {"name": name, "planned": planned, "sent": 0, "ok": 0, "failed": 0,
            "by_target": {}, "ttft_ms": []}  # fmt: skip


def record(phase: dict[str, Any], answer: Answer) -> None:
    """Count one answer into its phase."""
    phase["sent"] += 1
    if answer.status == 200:
        phase["ok"] += 1
        if answer.ttft_ms is not None:
            phase["ttft_ms"].append(round(answer.ttft_ms, 1))
    else:
        phase["failed"] += 1
    if answer.target:
        phase["by_target"][answer.target] = phase["by_target"].get(answer.target, 0) + 1


def burst(
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    phase: dict[str, Any],
    concurrency: int,
    save: Callable[[], None],
) -> None:
    """Send the phase's planned requests, `concurrency` at a time, counting each answer, and
    save the counts every SAVE_EVERY_S meanwhile.

    Only this thread saves (the senders' threads never touch the database, so they hold no
    connection of their own), and it saves under the counting lock, so that no count changes
    while the phases are written.
    """
    lock = threading.Lock()

    def one(_: int) -> None:
        answer = send_one(client, url, body)
        with lock:
            record(phase, answer)

    with ThreadPoolExecutor(max_workers=concurrency) as executor:
        futures = [executor.submit(one, n) for n in range(phase["planned"])]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=SAVE_EVERY_S)
            with lock:
                save()
        for future in futures:
            future.result()


def save_phases(run: TrafficRun) -> None:
    """Write the run's phases as they are now, for its page."""
    TrafficRun.objects.filter(pk=run.pk).update(phases=run.phases)


def ttft_p50(phase: dict[str, Any]) -> float | None:
    return statistics.median(phase["ttft_ms"]) if phase["ttft_ms"] else None


def share(phase: dict[str, Any], target_name: str) -> float:
    """Return the share of the phase's answered requests that the target served."""
    served = sum(phase["by_target"].values())
    return phase["by_target"].get(target_name, 0) / served if served else 0.0


def drill_verdict(target_name: str, phases: list[dict[str, Any]]) -> str:
    """Say whether the pool avoided the drained target and took it back after resume."""
    by_name = {phase["name"]: phase for phase in phases}
    parts = []
    if (drain := by_name.get("drain")) is not None:
        during = drain["by_target"].get(target_name, 0)
        word = "avoided" if during == 0 else "not avoided"
        parts.append(
            f"{word}: {during} of {drain['sent']} requests went to {target_name} while draining"
        )
    if (after := by_name.get("after resume")) is not None:
        got = share(after, target_name)
        word = "recovered" if got > 0 else "not recovered"
        text = f"{word}: {round(got * 100)} % share after resume"
        if (before := by_name.get("before")) is not None:
            text += f" (before: {round(share(before, target_name) * 100)} %)"
        parts.append(text)
    return "; ".join(parts)


def execute(run: TrafficRun) -> None:
    """Run the traffic of a claimed run; record its phases, verdict, status and end."""
    pool = run.pool
    params = run.params
    token_row, secret = ApiToken.issue(
        f"{run.get_kind_display()} #{run.pk}",
        pools=[pool.slug],
        project=pool.project,
        expires_at=timezone.now() + TOKEN_LIFETIME,
        created_by=run.created_by,
    )
    url = settings.NEXUS_CONTROLLER_URL.rstrip("/") + "/v1" + PATHS[params["kind"]]
    body = body_of(pool, params)
    headers = {"Authorization": f"Bearer {secret}"}
    limits = httpx.Limits(max_connections=params["concurrency"])
    try:
        with httpx.Client(headers=headers, timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

            def phase(name: str) -> dict[str, Any]:
                current = new_phase(name, params["requests"])
                run.phases.append(current)
                burst(client, url, body, current, params["concurrency"], lambda: save_phases(run))
                return current

            if run.kind == TrafficRunKind.TRY:
                phase("traffic")
            else:
                drill(run, phase)
        run.status = TrafficRunStatus.SUCCEEDED
    except Exception as exc:  # the row must say why the run stopped, whatever stopped it
        run.status = TrafficRunStatus.FAILED
        run.error = str(exc) or type(exc).__name__
    finally:
        token_row.revoke()
        run.finished_at = timezone.now()
        if run.kind == TrafficRunKind.DRILL:
            run.verdict = drill_verdict(params["target_name"], run.phases)
        run.save(update_fields=["status", "error", "phases", "verdict", "finished_at"])


def drill(run: TrafficRun, phase: Callable[[str], dict[str, Any]]) -> None:
    """Before, drain (the target drained), after resume (the target resumed)."""
    # Imported here: services imports this module.
    from pools import services

    target = Target.objects.select_related("node").get(pk=run.params["target_id"])
    phase("before")
    services.drain_target(target)
    time.sleep(CONFIG_PROPAGATION_S)
    phase("drain")
    services.resume_target(target)
    time.sleep(CONFIG_PROPAGATION_S)
    phase("after resume")
