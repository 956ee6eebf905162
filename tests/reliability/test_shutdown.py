"""SIGTERM on a web process with streams in flight: it stops accepting, lets them finish within
NEXUS_SHUTDOWN_GRACE_S, ends those that outlast it with an error event, and ships every history
record before it exits (the history writer beside it writes them). Under daphne, the default
server, and uvicorn, the documented fast one."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from nexus.models import ApiToken
from pools.models import Pool, RoutingOutcome, RoutingRecord
from tests.nexus.factories import make_pool, make_target
from tests.support import outcomes
from tests.support.http import LOOPBACK
from tests.support.live import (
    REPO_ROOT,
    LiveServer,
    running_history_writer,
    server_environment,
)
from tests.support.ports import free_port
from tests.support.simulator import running_simulator
from tests.support.traffic import Answer, chat_body, send
from tests.support.waiting import wait_until

STREAMS = 8
EXIT_TIMEOUT_S = 30.0
SERVERS = {
    "daphne": ["-m", "daphne", "-b", "127.0.0.1", "-p", "{port}", "{app}"],
    "uvicorn": [
        "-m", "uvicorn", "--host", "127.0.0.1", "--port", "{port}", "--no-access-log",
        "--timeout-graceful-shutdown", "{grace}", "{app}",
    ],
}  # fmt: skip


@contextmanager
def running_server(
    server: str, tmp_path: Path, grace_s: float, app: str = "nexus.asgi:application"
) -> Iterator[LiveServer]:
    """Run the web process under `server` with this shutdown grace; kill it if still running."""
    port = free_port()
    log_path = tmp_path / f"{server}-{port}.log"
    argv = [arg.format(port=port, grace=int(grace_s), app=app) for arg in SERVERS[server]]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, *argv],
            cwd=REPO_ROOT,
            env=server_environment(NEXUS_SHUTDOWN_GRACE_S=str(grace_s)),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    live = LiveServer(port=port, process=process, log_path=log_path)
    try:
        wait_until(lambda: _answers(live), timeout_s=30, what=live.log)
        yield live
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _answers(live: LiveServer) -> bool:
    if live.process.poll() is not None:
        raise RuntimeError(f"the server exited:\n{live.log()}")
    try:
        return LOOPBACK.get(f"{live.url}/healthz", timeout=2).status_code in (200, 503)
    except httpx.HTTPError:
        return False


def refuses_connections(live: LiveServer) -> bool:
    try:
        LOOPBACK.get(f"{live.url}/healthz", timeout=1)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


def exit_status(live: LiveServer, stacks_at: float | None = None) -> int:
    """Return the process's exit status; past EXIT_TIMEOUT_S, fail with its threads' stacks and
    its log, which say which step of the shutdown it is stuck in. Still running at `stacks_at`
    (a time.monotonic() value), it writes its stacks to its log and is waited on."""
    if stacks_at is not None:
        try:
            return live.process.wait(timeout=max(0.0, stacks_at - time.monotonic()))
        except subprocess.TimeoutExpired:
            # Once, a process whose streams had all finished still ran until the 20 s overrun
            # stopped it, its threads idle: its log says where the shutdown waited.
            live.process.send_signal(signal.SIGUSR1)  # nexus.asgi: faulthandler dumps the stacks
    try:
        return live.process.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        live.process.send_signal(signal.SIGUSR1)
        time.sleep(1)
        pytest.fail(f"still running {EXIT_TIMEOUT_S:g} s after SIGTERM:\n{live.log()[-6000:]}")


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
@pytest.mark.parametrize(
    ("grace_s", "tokens", "finish"),
    [(10.0, 15, True), (1.0, 80, False)],
    ids=["streams-finish", "grace-runs-out"],
)
def test_sigterm_lets_streams_finish_or_ends_them_with_an_error_and_keeps_every_history_row(
    committed_db, django_db_blocker, tmp_path: Path, server: str, grace_s: float, tokens: int,
    finish: bool,
) -> None:  # fmt: skip
    # Given streams of `tokens` tokens at 50 ms each in flight through one web process
    with running_simulator(model="demo-8b", ttft_ms=10, tpot_ms=50, concurrency=16) as engine:
        with django_db_blocker.unblock():
            pool = make_pool(f"shutdown-{server}-{int(grace_s)}")
            make_target(pool, "only", base_url=engine.base_url, model_id="demo-8b",
                        capacity_weight=16)  # fmt: skip
            token_row, token = ApiToken.issue("shutdown")
        try:
            # The history writer beside it writes what the server shipped before it exited.
            with (
                running_history_writer(tmp_path, f"writer-{server}"),
                running_server(server, tmp_path, grace_s) as live,
            ):
                url = f"{live.url}/v1/chat/completions"
                body = chat_body(pool.slug, max_tokens=tokens, stream=True)
                started = [threading.Event() for _ in range(STREAMS)]
                with ThreadPoolExecutor(max_workers=STREAMS) as executor:
                    futures = [
                        executor.submit(send, url, token, body, started=event, timeout_s=60)
                        for event in started
                    ]
                    assert all(event.wait(20) for event in started)
                    time.sleep(0.2)
                    # When the process gets SIGTERM
                    live.process.send_signal(signal.SIGTERM)
                    signalled = time.monotonic()
                    # Then it takes no new connection,
                    refused = wait_until(
                        lambda: refuses_connections(live) or live.process.poll() is not None,
                        timeout_s=5,
                        what="it still accepted connections",
                    )
                    answers: list[Answer] = [future.result() for future in futures]
                status = exit_status(live, stacks_at=signalled + grace_s + 3.0)
                exited_s = time.monotonic() - signalled
                log = live.log()
            with django_db_blocker.unblock():
                rows = dict(
                    RoutingRecord.objects.filter(pool=pool).values_list("request_id", "outcome")
                )
        finally:
            with django_db_blocker.unblock():
                Pool.objects.filter(pk=pool.pk).delete()
                token_row.delete()

    finished = [a for a in answers if a.status == 200 and a.done]
    cut = [a for a in answers if a.status == 200 and a.events and "shutting_down" in a.events[-1]]
    outcomes.record(
        f"shutdown_{server}_{'finish' if finish else 'cut'}",
        {
            "streams": len(answers),
            "finished": len(finished),
            "ended_with_error_event": len(cut),
            "history_rows": len(rows),
            "exited_after_s": round(exited_s, 2),
            "grace_s": grace_s,
        },
    )
    assert refused
    # uvicorn ends by raising the signal it caught again, so that its parent sees it.
    assert status == (0 if server == "daphne" else -signal.SIGTERM), log[-3000:]
    if finish:
        # every stream finished in full, and the process exited once they had
        assert len(finished) == STREAMS, [(a.status, a.events[-2:]) for a in answers]
        assert exited_s < grace_s, log[-8000:]
        expected = {RoutingOutcome.OK}
    else:
        # every stream still running after the grace ended with an error event, not cut short
        assert len(cut) == STREAMS, [(a.status, a.events[-2:]) for a in answers]
        assert exited_s < grace_s + 10
        expected = {RoutingOutcome.INTERRUPTED} if server == "daphne" else None
    # and every request's history row was written before the process exited.
    assert sorted(rows) == sorted(a.request_id for a in answers)
    if expected is not None:
        assert set(rows.values()) == expected


def test_a_shutdown_that_never_ends_stops_the_process_past_the_grace(tmp_path: Path) -> None:
    # Given daphne running an application whose shutdown waits forever (a dependency that hangs)
    grace_s = 1.0
    with running_server(
        "daphne", tmp_path, grace_s, app="tests.reliability.stuck_shutdown_asgi:application"
    ) as live:
        # When it gets SIGTERM
        live.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        status = exit_status(live)
        exited_s = time.monotonic() - signalled
        log = live.log()
    # Then it stops by itself once the shutdown ran the overrun past the grace, and says why.
    assert status == 0, log[-3000:]
    assert grace_s + 1.0 <= exited_s < EXIT_TIMEOUT_S  # the application's overrun_s: 1 s
    assert "graceful shutdown still running after 2 s, waiting at:" in log  # grace + overrun
    assert "stuck_shutdown_asgi.py:24 in never_done" in log  # where it waited
    assert "graceful shutdown still running 1 s past the grace; stopping now" in log
