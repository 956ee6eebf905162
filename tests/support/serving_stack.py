"""A whole serving stack for browser tests: an agent as trusted node "node-a" that may run
commands in the models directory, daphne, and a Celery worker with beat (the reconciler and the
probes) ticking fast. Every process shares the test's data dir."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from serving.models import models_root
from tests.nodes.fleet import trusted_node
from tests.support.agent import running_agent
from tests.support.live import LiveServer, running_nexus
from tests.support.worker import running_worker


@contextmanager
def serving_stack(tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    """Run the stack; yield daphne's server. What the processes read must be committed first."""
    # `python` in a definition's or a pasted command is this checkout's interpreter, as on a node
    # with it installed.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    with ExitStack() as stack:
        agent = stack.enter_context(
            running_agent(
                tmp_path,
                name="node-a",
                args=["--allow-dir", str(models_root())],
                env={"PATH": path},
            )
        )
        trusted_node("node-a", agent)
        shared = {"NEXUS_DATA_DIR": str(data_dir)}
        server = stack.enter_context(running_nexus(tmp_path, NEXUS_LEDGER="memory", **shared))
        stack.enter_context(
            running_worker(
                tmp_path, beat=True, NEXUS_SERVING_TICK_S="0.5", NEXUS_NODE_REFRESH_S="1", **shared
            )
        )
        yield server
