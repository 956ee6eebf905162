"""A real Prometheus server for tests (Debian's `prometheus` package): on a loopback port,
scraping a file_sd list of targets every second, which the test keeps up to date."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import processes
from tests.support.http import LOOPBACK
from tests.support.ports import free_port
from tests.support.waiting import wait_until

PROMETHEUS = shutil.which("prometheus")
SKIP_REASON = "Debian's prometheus is not installed (apt-get install prometheus; .ci/run does)"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Return every sample of a /metrics page by its name and label set."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@dataclass
class Prometheus:
    """A running Prometheus server and the file_sd list it scrapes."""

    url: str
    process: subprocess.Popen[bytes]
    targets_path: Path
    log_path: Path

    def scrape(self, targets: dict[str, list[int]]) -> None:
        """Scrape these loopback ports, labelled nexus_service="<name>" (the presets' label)."""
        groups = [
            {"targets": [f"127.0.0.1:{port}" for port in ports], "labels": {"nexus_service": name}}
            for name, ports in targets.items()
            if ports
        ]
        staged = self.targets_path.with_suffix(".tmp")
        staged.write_text(json.dumps(groups))
        staged.replace(self.targets_path)  # Prometheus must never read half a file


@contextmanager
def running_prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    """Run Debian's prometheus on a loopback port, scraping a file_sd list every second."""
    assert PROMETHEUS is not None
    port = free_port()
    targets = tmp_path / "replicas.json"
    targets.write_text("[]")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "replicas",
                        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, targets, log_path)
    try:
        wait_until(
            lambda: _ready(server), timeout_s=30, what=lambda: log_path.read_text(errors="replace")
        )
        yield server
    finally:
        processes.stop(process, 10)


def _ready(server: Prometheus) -> bool:
    if server.process.poll() is not None:
        raise RuntimeError(f"prometheus exited:\n{server.log_path.read_text(errors='replace')}")
    try:
        return LOOPBACK.get(f"{server.url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
