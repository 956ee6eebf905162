"""A real Celery worker process for tests, sharing the test database and Redis.

Tasks it runs read what the test wrote, so that data must be committed (`transactional_db` or
`committed_db`), and the tests remove their rows afterwards.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from nexus.celery import app
from tests.support import preloaded, processes
from tests.support.live import REPO_ROOT, server_environment

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass
class RunningWorker:
    """A running Celery worker and its log."""

    name: str
    process: preloaded.Process
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def answers_ping(self) -> bool:
        """Say whether the worker answers a broadcast ping (it consumes tasks by then)."""
        if self.process.poll() is not None:
            raise RuntimeError(f"the worker exited with {self.process.returncode}:\n{self.log()}")
        replies = app.control.ping(destination=[self.name], timeout=1.0)
        return any(self.name in reply for reply in replies)

    def stop(self) -> None:
        """SIGTERM (a warm shutdown: running tasks finish), SIGKILL after 15 s."""
        processes.stop(self.process, STOP_TIMEOUT_S)


@contextmanager
def running_worker(tmp_path: Path, *, beat: bool = False, **env: str) -> Iterator[RunningWorker]:
    """Run `celery -A nexus worker` (threads, 4 at once) until the block ends.

    beat: also run the beat scheduler in it (`--beat`), as `make run` does, so the periodic
    tasks of `CELERY_BEAT_SCHEDULE` run on their own; its state file is kept under tmp_path.
    """
    name = f"test-{uuid.uuid4().hex[:8]}@{REPO_ROOT.name}"
    log_path = tmp_path / f"worker-{name.partition('@')[0]}.log"
    command = [
        sys.executable, "-m", "celery", "-A", "nexus", "worker", "--pool", "threads",
        "--concurrency", "4", "--without-heartbeat", "--without-mingle", "--without-gossip",
        "-l", "INFO", "-n", name,
    ]  # fmt: skip
    if beat:
        # Its own schedule file: the data dir's may belong to another worker with beat.
        command += ["--beat", "--schedule", str(tmp_path / f"beat-{name.partition('@')[0]}")]
    with log_path.open("wb") as log:
        process = preloaded.start(command, server_environment(**env), log)
    worker = RunningWorker(name=name, process=process, log_path=log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not worker.answers_ping():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the worker did not answer in {START_TIMEOUT_S} s:\n{worker.log()}"
                )
        yield worker
    finally:
        worker.stop()
