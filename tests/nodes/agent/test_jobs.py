"""Deploy jobs: a runtime installed, a model fetched over loopback HTTP and verified, then served
by a real process until it answers; every failure a clear reason, nothing left half-running."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import textwrap
import time
import zipfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from nodes.agent import runtimes
from nodes.agent.errors import AgentError
from nodes.agent.jobs import RESTARTED, STOPPED, JobRunner
from nodes.agent.processes import ProcessManager, kill_all
from tests.support.fileserver import serving_file, serving_files
from tests.support.http import LOOPBACK
from tests.support.ports import free_port
from tests.support.waiting import eventually

# The jobs under test create virtual environments and start runtimes: every test is live.
pytestmark = pytest.mark.live

# Every wait is bounded by this; a healthy run needs a fraction of it.
WAIT_S = 30.0
CONTENT = bytes(range(256)) * 1024  # 256 KiB
DIGEST = hashlib.sha256(CONTENT).hexdigest()
# A minimal OpenAI-style runtime: lists one model (argv[2]) on 127.0.0.1:argv[1].
PROBE = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    port, name = int(sys.argv[1]), sys.argv[2]

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"object": "list", "data": [{"id": name}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", port), Models).serve_forever()
    """
)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "agent"
    path.mkdir()
    return path


@pytest.fixture
def allowed_dir(tmp_path: Path) -> Path:
    path = tmp_path / "shared-models"
    path.mkdir()
    return path


@pytest.fixture
async def make_runner(data_dir: Path, allowed_dir: Path) -> AsyncIterator[Callable[..., JobRunner]]:
    """Make job runners over one data dir (a second one is the agent restarted)."""
    made: list[tuple[JobRunner, ProcessManager]] = []

    def make(processes: ProcessManager | None = None) -> JobRunner:
        if processes is None:
            processes = ProcessManager(data_dir, [allowed_dir])
            processes.recover()
        runner = JobRunner(data_dir, processes, [data_dir, allowed_dir])
        runner.recover()
        made.append((runner, processes))
        return runner

    try:
        yield make
    finally:
        for runner, processes in made:
            await runner.close()
            await processes.close()
        kill_all(data_dir)


@pytest.fixture
def processes(data_dir: Path, allowed_dir: Path) -> ProcessManager:
    """The process manager of the `runner` fixture's agent."""
    return ProcessManager(data_dir, [allowed_dir])


@pytest.fixture
def runner(make_runner: Callable[..., JobRunner], processes: ProcessManager) -> JobRunner:
    return make_runner(processes)


def deploy(model: dict[str, Any], runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "deploy", "runtime": runtime or {"name": "simulator"}, "model": model}


def http_model(url: str, **fields: Any) -> dict[str, Any]:
    return {"source": "http", "location": url, "name": "demo", **fields}


async def finished(runner: JobRunner, job_id: str) -> dict[str, Any]:
    """Wait until the job has succeeded or failed and return it."""

    def done() -> dict[str, Any] | None:
        job = runner.get(job_id)
        return job if job["state"] != "running" else None

    return await eventually(done, timeout_s=WAIT_S, what=f"job {job_id} ends")


def served_models(job: dict[str, Any]) -> list[str]:
    response = LOOPBACK.get(f"{job['result']['base_url']}/models", timeout=5)
    response.raise_for_status()
    return [entry["id"] for entry in response.json()["data"]]


def saved(data_dir: Path, job_id: str) -> dict[str, Any]:
    return json.loads((data_dir / "jobs" / f"{job_id}.json").read_text())


def model_files(data_dir: Path) -> list[str]:
    """Return what models/ holds, partial downloads included, records excluded."""
    models = data_dir / "models"
    return sorted(
        str(path.relative_to(models))
        for path in models.rglob("*")
        if path.is_file() and ".sources" not in path.parts
    )


def make_wheel(directory: Path, module: str, source: str) -> Path:
    """Write a one-module pure-Python wheel pip installs offline."""
    name = f"{module}-0.1"
    files = {
        f"{module}.py": source.encode(),
        f"{name}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n".encode()
        ),
        f"{name}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    record.append(f"{name}.dist-info/RECORD,,")
    files[f"{name}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


# -- deploying ---------------------------------------------------------------------------------


async def test_it_downloads_verifies_and_serves_a_model_until_it_answers(
    runner: JobRunner, data_dir: Path
) -> None:
    with serving_file(CONTENT, name="model.gguf") as server:
        accepted = await runner.submit(deploy(http_model(server.url, sha256=DIGEST)))
        job = await finished(runner, accepted["id"])

    assert accepted["state"] == "running"
    assert accepted["kind"] == "deploy"
    assert job["state"] == "succeeded", job
    assert job["phase"] == "ready"
    assert job["error"] is None
    assert (job["bytes_done"], job["bytes_total"], job["percent"]) == (
        len(CONTENT),
        len(CONTENT),
        100.0,
    )
    model_path = data_dir / "models" / "model.gguf"
    assert job["result"]["model_path"] == str(model_path)
    assert job["result"]["digest"] == f"sha256:{DIGEST}"
    assert job["result"]["model_id"] == "demo"
    assert model_path.read_bytes() == CONTENT
    assert model_files(data_dir) == ["model.gguf"]
    assert served_models(job) == ["demo"]
    assert saved(data_dir, job["id"]) == job
    assert runner.list() == [job]


async def test_it_serves_a_model_from_an_allowed_path_with_a_custom_command(
    runner: JobRunner, processes: ProcessManager, allowed_dir: Path
) -> None:
    model = allowed_dir / "weights.bin"
    model.write_bytes(CONTENT)
    argv = [sys.executable, "-c", PROBE, "${PORT}", "${MODEL_NAME}", "${MODEL_PATH}"]

    accepted = await runner.submit(
        deploy(
            {"source": "path", "location": str(model), "name": "mine"},
            {"name": "custom", "argv": argv},
        )
    )
    job = await finished(runner, accepted["id"])

    assert job["state"] == "succeeded", job
    assert job["result"]["model_path"] == str(model)
    assert job["result"]["digest"] == f"sha256:{DIGEST}"
    assert served_models(job) == ["mine"]
    process = processes.get(job["result"]["process_id"])
    assert process["argv"][-2:] == ["mine", str(model)]
    assert process["model"] == {
        "id": "mine",
        "runtime": "custom",
        "digest": f"sha256:{DIGEST}",
        "health_path": "/v1/models",
    }


async def test_it_fetches_a_whole_hugging_face_repo_from_the_endpoint(
    runner: JobRunner, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = b'{"model_type": "tiny"}'
    listing = {
        "id": "org/tiny",
        "siblings": [
            {"rfilename": "config.json", "size": len(config)},
            {"rfilename": "weights/model.gguf", "size": len(CONTENT)},
        ],
    }
    hub = {
        "api/models/org/tiny": json.dumps(listing).encode(),
        "org/tiny/resolve/main/config.json": config,
        "org/tiny/resolve/main/weights/model.gguf": CONTENT,
    }
    with serving_files(hub) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        accepted = await runner.submit(deploy({"source": "hf", "location": "org/tiny"}))
        job = await finished(runner, accepted["id"])

    assert job["state"] == "succeeded", job
    repo = data_dir / "models" / "org--tiny"
    assert job["result"]["model_path"] == str(repo)
    assert job["result"]["model_id"] == "org/tiny"
    assert (repo / "config.json").read_bytes() == config
    assert (repo / "weights" / "model.gguf").read_bytes() == CONTENT
    manifest = f"{hashlib.sha256(config).hexdigest()}  config.json\n{DIGEST}  weights/model.gguf\n"
    assert job["result"]["digest"] == "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()
    assert job["bytes_total"] == len(config) + len(CONTENT)
    assert served_models(job) == ["org/tiny"]


async def test_it_fetches_one_file_of_a_hugging_face_repo(
    runner: JobRunner, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving_files({"org/tiny/resolve/main/model.gguf": CONTENT}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        spec = {"source": "hf", "location": "org/tiny", "file": "model.gguf", "sha256": DIGEST}
        job = await finished(runner, (await runner.submit(deploy(spec)))["id"])

    assert job["state"] == "succeeded", job
    assert job["result"]["model_path"] == str(data_dir / "models" / "org--tiny" / "model.gguf")
    assert job["result"]["digest"] == f"sha256:{DIGEST}"


# -- resuming and skipping downloads -----------------------------------------------------------


async def test_a_download_cut_short_by_an_agent_stop_resumes_with_a_range_request(
    make_runner: Callable[..., JobRunner], data_dir: Path
) -> None:
    content = bytes(range(256)) * 2048  # 512 KiB, two seconds at the throttled rate
    digest = hashlib.sha256(content).hexdigest()
    part = data_dir / "models" / "model.gguf.part"
    with serving_file(content, name="model.gguf", rate_bytes_per_s=256 * 1024) as server:
        spec = deploy(http_model(server.url, sha256=digest))
        first = make_runner()
        job_id = (await first.submit(spec))["id"]
        # Progress reaches the job's file while the download runs, not only at phase changes.
        await eventually(
            lambda: saved(data_dir, job_id)["bytes_done"] >= 64 * 1024,
            timeout_s=WAIT_S,
            what="progress saved",
        )
        running = first.get(job_id)
        assert running["phase"] == "downloading"
        assert running["bytes_total"] == len(content)
        assert running["message"].startswith("downloading model.gguf: ")
        assert running["message"].endswith(" of 512.0 KiB")
        await first.close()
        stopped = first.get(job_id)
        kept = part.stat().st_size

        second = make_runner()
        job = await finished(second, (await second.submit(spec))["id"])

    assert (stopped["state"], stopped["phase"], stopped["error"]) == (
        "failed",
        "downloading",
        STOPPED,
    )
    assert saved(data_dir, job_id) == stopped
    assert 0 < kept < len(content)
    assert server.ranges() == [None, f"bytes={kept}-"]
    assert job["state"] == "succeeded", job
    assert job["result"]["digest"] == f"sha256:{digest}"
    assert (data_dir / "models" / "model.gguf").read_bytes() == content
    assert model_files(data_dir) == ["model.gguf"]


async def test_a_part_left_on_disk_is_resumed_and_hashed_from_the_start(
    runner: JobRunner, data_dir: Path
) -> None:
    models = data_dir / "models"
    models.mkdir()
    with serving_file(CONTENT, name="model.gguf") as server:
        (models / "model.gguf.part").write_bytes(CONTENT[:1000])
        (models / "model.gguf.part.json").write_text(json.dumps({"url": server.url}))
        job = await finished(runner, (await runner.submit(deploy(http_model(server.url))))["id"])

    assert job["state"] == "succeeded", job
    assert server.ranges() == ["bytes=1000-"]
    assert (models / "model.gguf").read_bytes() == CONTENT
    assert job["result"]["digest"] == f"sha256:{DIGEST}"
    assert model_files(data_dir) == ["model.gguf"]


async def test_a_part_from_another_url_is_discarded(runner: JobRunner, data_dir: Path) -> None:
    models = data_dir / "models"
    models.mkdir()
    (models / "model.gguf.part").write_bytes(b"x" * 1000)
    (models / "model.gguf.part.json").write_text(json.dumps({"url": "http://elsewhere/model.gguf"}))
    with serving_file(CONTENT, name="model.gguf") as server:
        job = await finished(runner, (await runner.submit(deploy(http_model(server.url))))["id"])

    assert job["state"] == "succeeded", job
    assert server.ranges() == [None]
    assert (models / "model.gguf").read_bytes() == CONTENT


async def test_a_broken_connection_keeps_the_part_for_the_next_attempt(
    runner: JobRunner, data_dir: Path
) -> None:
    with serving_file(CONTENT, name="model.gguf", cut_after_bytes=100_000) as server:
        spec = deploy(http_model(server.url, sha256=DIGEST))
        broken = await finished(runner, (await runner.submit(spec))["id"])
        retried = await finished(runner, (await runner.submit(spec))["id"])

    assert broken["state"] == "failed"
    assert broken["phase"] == "downloading"
    assert broken["error"] == (
        f"download of {server.url} failed: the connection broke off after 100000 of "
        f"{len(CONTENT)} bytes (the next attempt resumes from there)"
    )
    assert server.ranges() == [None, "bytes=100000-"]
    assert retried["state"] == "succeeded", retried
    assert (data_dir / "models" / "model.gguf").read_bytes() == CONTENT


@pytest.mark.parametrize("checked", [True, False], ids=["with-sha256", "without-sha256"])
async def test_a_model_already_downloaded_is_not_downloaded_again(
    runner: JobRunner, checked: bool
) -> None:
    fields = {"sha256": DIGEST} if checked else {}
    with serving_file(CONTENT, name="model.gguf") as server:
        spec = deploy(http_model(server.url, **fields))
        first = await finished(runner, (await runner.submit(spec))["id"])
        second = await finished(runner, (await runner.submit(spec))["id"])

    assert (first["state"], second["state"]) == ("succeeded", "succeeded")
    assert len(server.requests) == 1
    assert second["result"]["digest"] == f"sha256:{DIGEST}"


# -- failures ----------------------------------------------------------------------------------


async def test_a_sha256_mismatch_deletes_the_download_and_names_both_digests(
    runner: JobRunner, processes: ProcessManager, data_dir: Path
) -> None:
    expected = "ab" * 32
    with serving_file(CONTENT, name="model.gguf") as server:
        spec = deploy(http_model(server.url, sha256=expected.upper()))
        job = await finished(runner, (await runner.submit(spec))["id"])

    assert job["state"] == "failed"
    assert job["phase"] == "verifying"
    assert job["error"] == f"sha256 mismatch for model.gguf: expected {expected}, got {DIGEST}"
    assert job["message"] == f"failed: {job['error']}"
    assert model_files(data_dir) == []
    assert processes.running() == []


async def test_a_missing_file_fails_with_the_servers_answer(
    runner: JobRunner, data_dir: Path
) -> None:
    with serving_files({"other.gguf": CONTENT}) as server:
        url = f"{server.base_url}/missing.gguf"
        job = await finished(runner, (await runner.submit(deploy(http_model(url))))["id"])

    assert (job["state"], job["phase"]) == ("failed", "downloading")
    assert job["error"] == f"download of {url} failed: answered 404 Not Found"
    assert model_files(data_dir) == []


async def test_an_unreachable_server_fails_at_once_with_the_reason(runner: JobRunner) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/model.gguf"
    job = await finished(runner, (await runner.submit(deploy(http_model(url))))["id"])

    assert (job["state"], job["phase"]) == ("failed", "downloading")
    assert job["error"] == (
        f"download of {url} failed: cannot connect to 127.0.0.1:{port}: Connection refused"
    )


@pytest.mark.parametrize("file", ["model.gguf", None], ids=["one-file", "whole-repo"])
async def test_an_unreachable_hugging_face_hub_fails_fast(
    runner: JobRunner, monkeypatch: pytest.MonkeyPatch, file: str | None
) -> None:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    began = time.monotonic()
    spec = deploy({"source": "hf", "location": "org/tiny", "file": file})
    job = await finished(runner, (await runner.submit(spec))["id"])

    assert time.monotonic() - began < 5
    assert (job["state"], job["phase"]) == ("failed", "downloading")
    assert job["error"] == (
        f"cannot reach the Hugging Face hub at {endpoint}: "
        f"cannot connect to 127.0.0.1:{port}: Connection refused"
    )


async def test_hf_hub_offline_fails_without_trying_the_hub(
    runner: JobRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = deploy({"source": "hf", "location": "org/tiny", "file": "model.gguf"})
    job = await finished(runner, (await runner.submit(spec))["id"])

    assert job["state"] == "failed"
    assert job["error"] == (
        "cannot reach the Hugging Face hub at https://huggingface.co: HF_HUB_OFFLINE is set"
    )


@pytest.mark.parametrize(("name", "label"), [("vllm", "vLLM"), ("sglang", "SGLang")])
async def test_a_gpu_runtime_fails_at_once_on_a_node_without_an_nvidia_gpu(
    runner: JobRunner, data_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str, label: str
) -> None:
    async def no_gpus() -> list[dict[str, Any]]:
        return []

    monkeypatch.setattr(runtimes, "detect_gpus", no_gpus)
    spec = deploy(http_model("http://127.0.0.1:9/model.gguf"), {"name": name})
    job = await finished(runner, (await runner.submit(spec))["id"])

    assert (job["state"], job["phase"]) == ("failed", "installing")
    assert job["error"] == (
        f"{label} needs an NVIDIA GPU; this node has none (nvidia-smi found no GPU)"
    )
    assert not (data_dir / "runtimes").exists()


async def test_a_runtime_that_exits_before_it_is_ready_fails_with_its_last_lines(
    runner: JobRunner, allowed_dir: Path
) -> None:
    model = allowed_dir / "weights.bin"
    model.write_bytes(b"weights")
    crash = "import sys; print('loading'); print('out of memory'); sys.exit(3)"
    argv = [sys.executable, "-c", crash, "${PORT}"]
    spec = deploy({"source": "path", "location": str(model)}, {"name": "custom", "argv": argv})
    job = await finished(runner, (await runner.submit(spec))["id"])

    assert (job["state"], job["phase"]) == ("failed", "starting")
    assert job["error"] == (
        "custom exited with code 3 before it was ready; its last lines:\nloading\nout of memory"
    )
    assert (
        job["message"] == "failed: custom exited with code 3 before it was ready; its last lines:"
    )


async def test_a_runtime_command_that_cannot_be_run_fails_the_job(
    runner: JobRunner, allowed_dir: Path
) -> None:
    model = allowed_dir / "weights.bin"
    model.write_bytes(b"weights")
    argv = ["/nonexistent/serve", "${PORT}"]
    spec = deploy({"source": "path", "location": str(model)}, {"name": "custom", "argv": argv})
    job = await finished(runner, (await runner.submit(spec))["id"])

    assert (job["state"], job["phase"]) == ("failed", "starting")
    assert job["error"] == "cannot start custom: argv[0]: /nonexistent/serve not found"
    assert job["result"]["process_id"] is None


async def test_a_runtime_that_never_lists_its_model_is_stopped(
    runner: JobRunner, processes: ProcessManager, allowed_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtimes.RuntimeSpec, "ready_timeout_s", lambda self: 1.5)
    model = allowed_dir / "weights.bin"
    model.write_bytes(b"weights")
    argv = [sys.executable, "-c", PROBE, "${PORT}", "some-other-model"]
    spec = deploy(
        {"source": "path", "location": str(model), "name": "mine"},
        {"name": "custom", "argv": argv},
    )
    job = await finished(runner, (await runner.submit(spec))["id"])

    assert (job["state"], job["phase"]) == ("failed", "starting")
    url = f"{job['result']['base_url']}/models"
    assert job["error"] == f"custom did not list mine at {url} within 1.5 s"
    process = processes.get(job["result"]["process_id"])
    assert process["state"] == "stopped"
    assert f"stopped process {process['id']}" in job["log"]


# -- installing --------------------------------------------------------------------------------


async def test_a_custom_requirement_is_installed_once_into_its_own_environment(
    runner: JobRunner, processes: ProcessManager, data_dir: Path, allowed_dir: Path, tmp_path: Path
) -> None:
    wheel = make_wheel(tmp_path, "nexus_probe", PROBE)
    model = allowed_dir / "weights.bin"
    model.write_bytes(b"weights")
    # `python` is the environment's own: only there is nexus_probe importable.
    argv = ["python", "-m", "nexus_probe", "${PORT}", "${MODEL_NAME}"]
    spec = deploy(
        {"source": "path", "location": str(model), "name": "probed"},
        {"name": "custom", "requirement": str(wheel), "argv": argv},
    )
    first = await finished(runner, (await runner.submit(spec))["id"])
    second = await finished(runner, (await runner.submit(spec))["id"])

    venv = data_dir / "runtimes" / f"custom-{hashlib.sha256(str(wheel).encode()).hexdigest()[:12]}"
    assert first["state"] == "succeeded", first
    assert any("Successfully installed nexus-probe-0.1" in line for line in first["log"])
    assert runtimes.installed(venv, [str(wheel)])
    assert second["state"] == "succeeded", second
    assert f"{wheel} is already installed in {venv}" in second["log"]
    assert served_models(second) == ["probed"]
    process = processes.get(second["result"]["process_id"])
    assert process["argv"][0] == str(venv / "bin" / "python")


async def test_a_build_environment_reaches_pip_which_builds_afresh_and_is_stamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NEXUS_PROBE_BUILD", raising=False)
    wheel = make_wheel(tmp_path, "nexus_probe", PROBE)
    venv = tmp_path / "runtimes" / "probe"
    build_env = {"NEXUS_PROBE_BUILD": "portable"}
    log: list[str] = []

    await runtimes.install(venv, [str(wheel)], log.append, build_env)

    pip_line = next(line for line in log if line.startswith("$ ") and " -m pip install " in line)
    assert "--no-cache-dir" in pip_line.split()
    assert "NEXUS_PROBE_BUILD=portable" in log
    assert runtimes.installed(venv, [str(wheel)], build_env)
    assert not runtimes.installed(venv, [str(wheel)])
    again: list[str] = []
    await runtimes.install(venv, [str(wheel)], again.append, build_env)
    assert again == [f"{wheel} is already installed in {venv}"]


async def test_a_failing_pip_install_fails_the_job_with_pips_last_lines(
    runner: JobRunner, data_dir: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "no_such_runtime-1.0-py3-none-any.whl"
    spec = deploy(
        http_model("http://127.0.0.1:9/model.gguf"),
        {"name": "custom", "requirement": str(missing), "argv": ["serve", "${PORT}"]},
    )
    job = await finished(runner, (await runner.submit(spec))["id"])

    assert (job["state"], job["phase"]) == ("failed", "installing")
    first_line, *pip_lines = job["error"].splitlines()
    assert first_line == f"pip install {missing} failed with exit code 1:"
    assert any("does not exist" in line for line in pip_lines)
    venv = runtimes.RuntimeSpec("custom", requirement=str(missing)).venv(data_dir)
    assert venv is not None and not runtimes.installed(venv, [str(missing)])


# -- refusing ----------------------------------------------------------------------------------

SIM = {"name": "simulator"}
URL = "http://127.0.0.1:9/model.gguf"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (["deploy"], "body: must be a JSON object"),
        ({"runtime": SIM, "model": http_model(URL)}, "kind: required"),
        ({**deploy(http_model(URL)), "kind": "train"}, "kind: unknown kind 'train' (deploy)"),
        ({**deploy(http_model(URL)), "when": 1}, "when: unknown field (kind, runtime, model)"),
        ({"kind": "deploy", "model": http_model(URL)}, "runtime: required"),
        (deploy(http_model(URL), {"argv": []}), "runtime.name: required"),
        (
            deploy(http_model(URL), {"name": "foo"}),
            "runtime.name: unknown runtime 'foo' (vllm, sglang, llama-cpp, custom, simulator)",
        ),
        (
            deploy(http_model(URL), {"name": "simulator", "requirement": "vllm"}),
            "runtime.requirement: only for the custom runtime, not simulator",
        ),
        (
            deploy(http_model(URL), {"name": "vllm", "argv": ["x"]}),
            "runtime.argv: only for the custom runtime, not vllm",
        ),
        (
            deploy(http_model(URL), {"name": "custom"}),
            "runtime.argv: required for the custom runtime",
        ),
        (
            deploy(http_model(URL), {"name": "custom", "argv": "serve ${PORT}"}),
            "runtime.argv: must be a non-empty list of strings",
        ),
        (
            deploy(http_model(URL), {"name": "custom", "argv": ["serve", 8000]}),
            "runtime.argv[1]: must be a string",
        ),
        (
            deploy(http_model(URL), {"name": "custom", "argv": ["serve", "${MODEL_PATH}"]}),
            "runtime.argv: must contain ${PORT}, where the runtime is to listen",
        ),
        (
            deploy(
                http_model(URL),
                {"name": "custom", "requirement": "--index-url=http://x", "argv": ["${PORT}"]},
            ),
            "runtime.requirement: must be a pip requirement, not an option",
        ),
        (
            deploy(http_model(URL), {"name": "simulator", "version": "1"}),
            "runtime.version: unknown field (name, requirement, argv)",
        ),
        ({"kind": "deploy", "runtime": SIM}, "model: required"),
        ({"kind": "deploy", "runtime": SIM, "model": "x"}, "model: must be a JSON object"),
        (deploy({"location": URL}), "model.source: required"),
        (
            deploy({"source": "s3", "location": URL}),
            "model.source: unknown source 's3' (path, http, hf)",
        ),
        (deploy({"source": "http"}), "model.location: required"),
        (deploy({"source": "http", "location": ""}), "model.location: required"),
        (
            deploy({"source": "http", "location": "ftp://host/model.gguf"}),
            "model.location: must be an http:// or https:// URL",
        ),
        (
            deploy({"source": "http", "location": "http://127.0.0.1:9/"}),
            "model.location: the URL ends in no file name; give model.file",
        ),
        (
            deploy(http_model(URL, file="../escape.gguf")),
            "model.file: must be a plain file name (no directories, no dot first)",
        ),
        (
            deploy(http_model(URL, file="model.gguf.part")),
            "model.file: must be a plain file name (no directories, no dot first)",
        ),
        (
            deploy({"source": "path", "location": "models/weights.bin"}),
            "model.location: must be an absolute path on the node",
        ),
        (
            deploy({"source": "hf", "location": "just-a-name"}),
            "model.location: must be a Hugging Face repo id, org/name",
        ),
        (
            deploy({"source": "hf", "location": "org/tiny", "file": "a/../../escape"}),
            "model.file: must be a path inside the repo, without ..",
        ),
        (
            deploy({"source": "hf", "location": "org/tiny", "sha256": DIGEST}),
            "model.sha256: checks one file; give model.file too",
        ),
        (deploy(http_model(URL, sha256="abc")), "model.sha256: must be 64 hex digits"),
        (deploy(http_model(URL, sha256="g" * 64)), "model.sha256: must be 64 hex digits"),
        (deploy(http_model(URL, sha256=DIGEST + "\n")), "model.sha256: must be 64 hex digits"),
        (
            deploy(http_model(URL, sha265=DIGEST)),
            "model.sha265: unknown field (source, location, file, sha256, name)",
        ),
        (deploy(http_model(URL, name=5)), "model.name: must be a string"),
        (
            deploy(http_model(URL, name="two\nlines")),
            "model.name: must be printable, at most 200 characters",
        ),
        (
            deploy({"source": "hf", "location": "org/tiny"}, {"name": "llama-cpp"}),
            "model.file: required for llama.cpp, which serves one .gguf file",
        ),
    ],
)
async def test_it_refuses_an_invalid_spec_naming_the_field(
    runner: JobRunner, data_dir: Path, spec: Any, message: str
) -> None:
    with pytest.raises(AgentError) as refused:
        await runner.submit(spec)

    assert (refused.value.status, refused.value.code) == (400, "invalid_request")
    assert refused.value.message == message
    assert runner.list() == []
    assert not (data_dir / "jobs").exists()


async def test_it_refuses_a_path_that_does_not_exist_or_takes_a_file(
    runner: JobRunner, allowed_dir: Path
) -> None:
    missing = allowed_dir / "missing.gguf"
    with pytest.raises(AgentError) as refused:
        await runner.submit(deploy({"source": "path", "location": str(missing)}))
    assert (refused.value.status, refused.value.message) == (
        400,
        f"model.location: {missing} does not exist",
    )

    spec = {"source": "path", "location": str(allowed_dir), "file": "x.gguf"}
    with pytest.raises(AgentError) as refused:
        await runner.submit(deploy(spec))
    assert refused.value.message == "model.file: only for the http and hf sources"

    spec = {"source": "path", "location": str(allowed_dir), "sha256": DIGEST}
    with pytest.raises(AgentError) as refused:
        await runner.submit(deploy(spec))
    assert refused.value.message == f"model.sha256: checks one file; {allowed_dir} is a directory"
    assert runner.list() == []


@pytest.mark.parametrize("where", ["outside", "dot-dot"])
async def test_it_refuses_a_path_outside_the_allowed_directories(
    runner: JobRunner, data_dir: Path, allowed_dir: Path, tmp_path: Path, where: str
) -> None:
    secret = tmp_path / "secret.gguf"
    secret.write_bytes(b"secret")
    location = str(secret) if where == "outside" else f"{allowed_dir}/../secret.gguf"

    with pytest.raises(AgentError) as refused:
        await runner.submit(deploy({"source": "path", "location": location}))

    assert (refused.value.status, refused.value.code) == (403, "path_not_allowed")
    assert location in refused.value.message
    assert runner.list() == []
    assert not (data_dir / "jobs").exists()


# -- restarts ----------------------------------------------------------------------------------


async def test_jobs_left_running_by_a_stopped_agent_are_failed_on_restart(
    make_runner: Callable[..., JobRunner], data_dir: Path
) -> None:
    jobs = data_dir / "jobs"
    jobs.mkdir()
    left = {
        "id": "job-0123456789ab",
        "kind": "deploy",
        "state": "running",
        "phase": "downloading",
        "bytes_done": 10,
        "bytes_total": 100,
        "percent": 10.0,
        "message": "downloading model.gguf: 10 of 100 B",
        "error": None,
        "log": [],
        "result": None,
        "created_at": "2026-01-01T00:00:00.000Z",
        "updated_at": "2026-01-01T00:00:01.000Z",
    }
    done = {
        **left,
        "id": "job-ba9876543210",
        "state": "succeeded",
        "phase": "ready",
        "created_at": "2026-01-01T00:00:02.000Z",
    }
    for job in (left, done):
        (jobs / f"{job['id']}.json").write_text(json.dumps(job))
    (jobs / "job-broken.json").write_text("{")

    runner = make_runner()

    recovered = runner.get(left["id"])
    assert (recovered["state"], recovered["phase"], recovered["error"]) == (
        "failed",
        "downloading",
        RESTARTED,
    )
    assert saved(data_dir, left["id"]) == recovered
    assert runner.get(done["id"]) == done
    assert [job["id"] for job in runner.list()] == [left["id"], done["id"]]


async def test_an_unknown_job_is_not_found(runner: JobRunner) -> None:
    with pytest.raises(AgentError) as missing:
        runner.get("job-nope")

    assert (missing.value.status, missing.value.code) == (404, "job_not_found")
    assert missing.value.message == "job job-nope does not exist on this node"
