"""The agent's HTTP API of docs/nodes.md, against a real agent process over loopback."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

from nodes.agent.identity import fingerprint_of, verify_challenge
from tests.support.agent import RunningAgent, running_agent, start_managed_simulator
from tests.support.ports import free_port
from tests.support.simulator import running_simulator

T = TypeVar("T")
http = httpx.Client(timeout=10)

# One route of each family, with a body where the route takes one.
ROUTES = [
    ("GET", "/agent/v1/info"),
    ("GET", "/agent/v1/models"),
    ("GET", "/agent/v1/metrics"),
    ("GET", "/agent/v1/processes"),
    ("POST", "/agent/v1/processes"),
    ("GET", "/agent/v1/processes/p-00000000"),
    ("GET", "/agent/v1/processes/p-00000000/log"),
    ("DELETE", "/agent/v1/processes/p-00000000"),
    ("GET", "/agent/v1/jobs"),
    ("POST", "/agent/v1/jobs"),
    ("GET", "/agent/v1/jobs/j-00000000"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/no/such/route"),
]
BAD_AUTHORIZATIONS: dict[str, str | bytes | None] = {
    "missing": None,
    "wrong": "Bearer wrong-secret",
    "prefix": "Bearer node-secre",
    "longer": "Bearer node-secret-and-more",
    "other-scheme": "Basic bm9kZS1zZWNyZXQ=",
    "bare": "node-secret",
    "non-ascii": "Bearer nöde-secret".encode(),
}


def teardown_module() -> None:
    http.close()


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Return the first truthy result of `probe`, polling until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    with running_agent(tmp_path_factory.mktemp("api")) as agent:
        yield agent


def get(agent: RunningAgent, path: str, **params: Any) -> httpx.Response:
    return http.get(f"{agent.url}{path}", headers=agent.headers(), params=params)


def error_of(response: httpx.Response) -> dict[str, Any]:
    return response.json()["error"]


# -- authentication ----------------------------------------------------------------------------


@pytest.mark.parametrize("authorization", BAD_AUTHORIZATIONS.values(), ids=BAD_AUTHORIZATIONS)
@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_every_route_refuses_a_caller_without_the_node_credential(
    agent: RunningAgent, method: str, path: str, authorization: str | bytes | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    body = b'{"model": "demo-8b", "messages": []}' if method == "POST" else None

    response = http.request(method, f"{agent.url}{path}", headers=headers, content=body)

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert error_of(response)["code"] == "invalid_credential"
    assert error_of(response)["type"] == "authentication_error"


def test_the_credential_appears_in_no_answer_and_no_log_line(agent: RunningAgent) -> None:
    info = get(agent, "/agent/v1/info")
    refused = http.get(f"{agent.url}/agent/v1/info", headers={"Authorization": "Bearer x"})

    assert agent.credential not in info.text
    assert agent.credential not in refused.text
    assert agent.credential not in agent.log()


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/agent/v1/processes", "/agent/v1/jobs", "/v1/chat/completions", "/v1/embeddings"]
)
def test_a_body_that_is_not_json_is_refused_with_invalid_json(
    agent: RunningAgent, path: str
) -> None:
    response = http.post(f"{agent.url}{path}", headers=agent.headers(), content=b'{"argv": [')

    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"
    assert error_of(response)["message"].startswith("the body is not valid JSON")


def test_a_json_body_that_is_not_an_object_names_the_body(agent: RunningAgent) -> None:
    response = http.post(f"{agent.url}/agent/v1/processes", headers=agent.headers(), json=[1])

    assert response.status_code == 400
    assert error_of(response) == {
        "message": "body: expected a JSON object",
        "type": "invalid_request_error",
        "code": "invalid_request",
    }


def test_a_body_over_16_mib_is_refused_before_it_is_parsed(agent: RunningAgent) -> None:
    oversized = b'{"model": "x", "prompt": "' + b"a" * (16 * 2**20) + b'"}'

    response = http.post(f"{agent.url}/v1/completions", headers=agent.headers(), content=oversized)

    assert response.status_code == 413
    assert error_of(response)["code"] == "request_too_large"


def test_an_unknown_route_is_a_json_not_found(agent: RunningAgent) -> None:
    response = get(agent, "/agent/v1/nothing-here")

    assert response.status_code == 404
    assert response.headers["Content-Type"].startswith("application/json")
    assert error_of(response) == {
        "message": "GET /agent/v1/nothing-here: not found",
        "type": "invalid_request_error",
        "code": "not_found",
    }


def test_a_known_route_with_the_wrong_method_is_refused_in_json(agent: RunningAgent) -> None:
    response = http.put(f"{agent.url}/agent/v1/info", headers=agent.headers())

    assert response.status_code == 405
    assert set(response.headers["Allow"].split(",")) == {"GET", "HEAD"}
    assert error_of(response)["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/agent/v1/processes/p-00000000", "process_not_found"),
        ("/agent/v1/processes/p-00000000/log", "process_not_found"),
        ("/agent/v1/jobs/j-00000000", "job_not_found"),
    ],
)
def test_an_unknown_process_or_job_is_not_found(agent: RunningAgent, path: str, code: str) -> None:
    response = get(agent, path)

    assert response.status_code == 404
    assert error_of(response)["code"] == code


# -- identity and resources --------------------------------------------------------------------


def test_info_shows_the_identity_the_agent_printed(agent: RunningAgent) -> None:
    info = get(agent, "/agent/v1/info").json()

    assert info["fingerprint"] == agent.fingerprint
    assert fingerprint_of(info["public_key"]) == agent.fingerprint
    assert "challenge_signature" not in info


def test_info_signs_a_challenge_with_the_key_of_its_fingerprint(agent: RunningAgent) -> None:
    challenge = os.urandom(16).hex()

    info = get(agent, "/agent/v1/info", challenge=challenge).json()

    assert verify_challenge(info["public_key"], challenge, info["challenge_signature"])
    assert not verify_challenge(info["public_key"], challenge[::-1], info["challenge_signature"])


@pytest.mark.parametrize("challenge", ["", "not-hex", "ab" * 200])
def test_a_challenge_that_is_not_a_short_hex_nonce_is_refused(
    agent: RunningAgent, challenge: str
) -> None:
    response = get(agent, "/agent/v1/info", challenge=challenge)

    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_request"
    assert error_of(response)["message"].startswith("challenge: ")


def test_info_describes_the_machine(agent: RunningAgent) -> None:
    info = get(agent, "/agent/v1/info").json()

    assert info["agent_version"] == "0.1.0"
    assert info["hostname"] == socket.gethostname()
    assert info["allowed_dirs"] == [str(agent.data_dir.resolve())]
    assert info["started_at"].endswith("Z")
    assert info["resources"]["cpu_count"] == os.cpu_count()
    assert info["resources"]["memory_bytes"] == psutil.virtual_memory().total
    if shutil.which("nvidia-smi") is None:
        assert info["resources"]["gpus"] == []
    assert set(info["free"]) == {"cpu_count", "memory_bytes", "gpus"}


def test_free_resources_are_the_totals_less_what_running_processes_reserved(
    tmp_path: Path,
) -> None:
    with running_agent(tmp_path, args=["--allow-dir", str(tmp_path)]) as agent:
        total = get(agent, "/agent/v1/info").json()["resources"]
        assert get(agent, "/agent/v1/info").json()["free"] == total
        reserved = {"cpu_count": 1, "memory_bytes": 2**30, "gpus": []}
        process = http.post(
            f"{agent.url}/agent/v1/processes",
            headers=agent.headers(),
            json={"argv": ["sleep", "60"], "resources": reserved},
        ).json()

        while_running = get(agent, "/agent/v1/info").json()["free"]
        http.delete(f"{agent.url}/agent/v1/processes/{process['id']}", headers=agent.headers())
        after_stop = get(agent, "/agent/v1/info").json()["free"]

    assert while_running == {
        "cpu_count": total["cpu_count"] - 1,
        "memory_bytes": total["memory_bytes"] - 2**30,
        "gpus": total["gpus"],
    }
    assert after_stop == total


def test_gpus_are_what_nvidia_smi_lists_and_free_ones_exclude_reserved_ones(
    tmp_path: Path,
) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    nvidia_smi = fake_bin / "nvidia-smi"
    # A stand-in for the driver's tool, printing what the agent's query gets on a 2-GPU node.
    nvidia_smi.write_text(
        "#!/bin/sh\nprintf '0, NVIDIA H200, 143771\\n1, NVIDIA H200, 143771\\n'\n"
    )
    nvidia_smi.chmod(0o755)
    path = f"{fake_bin}:{os.environ['PATH']}"

    with running_agent(tmp_path, env={"PATH": path}) as agent:
        gpus = get(agent, "/agent/v1/info").json()["resources"]["gpus"]
        process = http.post(
            f"{agent.url}/agent/v1/processes",
            headers=agent.headers(),
            json={"argv": ["sleep", "60"], "resources": {"gpus": [1]}},
        ).json()
        free_gpus = get(agent, "/agent/v1/info").json()["free"]["gpus"]
        http.delete(
            f"{agent.url}/agent/v1/processes/{process['id']}?grace=0", headers=agent.headers()
        )

    h200 = {"name": "NVIDIA H200", "memory_bytes": 143771 * 2**20}
    assert gpus == [{"index": 0, **h200}, {"index": 1, **h200}]
    assert free_gpus == [{"index": 0, **h200}]


def test_a_hanging_nvidia_smi_does_not_keep_the_agent_from_starting(tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 60\n")
    (fake_bin / "nvidia-smi").chmod(0o755)

    started = time.monotonic()
    with running_agent(tmp_path, env={"PATH": f"{fake_bin}:{os.environ['PATH']}"}) as agent:
        took = time.monotonic() - started
        gpus = get(agent, "/agent/v1/info").json()["resources"]["gpus"]

    assert gpus == []
    assert took < 15


def test_allowed_dirs_list_the_data_dir_and_each_allowed_one(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()

    with running_agent(tmp_path, args=["--allow-dir", str(models)]) as agent:
        allowed = get(agent, "/agent/v1/info").json()["allowed_dirs"]

    assert allowed == [str((tmp_path / "agent").resolve()), str(models.resolve())]


# -- metrics -----------------------------------------------------------------------------------


def test_metrics_report_the_node_and_each_managed_process(agent: RunningAgent) -> None:
    hold_64_mib = "import time; block = bytearray(64 * 1024 * 1024); time.sleep(60)"
    process = http.post(
        f"{agent.url}/agent/v1/processes",
        headers=agent.headers(),
        json={"argv": [sys.executable, "-c", hold_64_mib], "name": "holder"},
    ).json()

    def sampled() -> dict[str, Any] | None:
        metrics = get(agent, "/agent/v1/metrics").json()
        mine = [p for p in metrics["processes"] if p["id"] == process["id"]]
        return metrics if mine and mine[0]["memory_bytes"] >= 64 * 2**20 else None

    metrics = wait_for(sampled, timeout=10, what="a sample of the process holding 64 MiB")
    http.delete(f"{agent.url}/agent/v1/processes/{process['id']}?grace=0", headers=agent.headers())

    node = metrics["node"]
    assert set(node) == {
        "cpu_percent",
        "memory_used_bytes",
        "memory_total_bytes",
        "net_rx_bytes_per_s",
        "net_tx_bytes_per_s",
    }
    assert node["memory_total_bytes"] == psutil.virtual_memory().total
    assert 0 < node["memory_used_bytes"] <= node["memory_total_bytes"]
    assert 0 <= node["cpu_percent"] <= 100
    [mine] = [p for p in metrics["processes"] if p["id"] == process["id"]]
    assert mine["pid"] == process["pid"]
    assert mine["cpu_percent"] >= 0
    assert set(mine) == {"id", "pid", "cpu_percent", "memory_bytes"}


def test_network_rates_follow_the_traffic_between_samples(agent: RunningAgent) -> None:
    stop = threading.Event()
    sender = threading.Thread(target=send_over_loopback, args=(stop,))
    sender.start()

    def busy_sample() -> dict[str, Any] | None:
        metrics = get(agent, "/agent/v1/metrics").json()
        return metrics if metrics["node"]["net_rx_bytes_per_s"] >= 8 * 2**20 else None

    try:
        # About 64 MiB/s go over loopback, which counts them as received and as sent.
        metrics = wait_for(busy_sample, timeout=10, what="a sample that saw the traffic")
    finally:
        stop.set()
        sender.join(timeout=10)

    assert metrics["node"]["net_tx_bytes_per_s"] >= 8 * 2**20


def send_over_loopback(stop: threading.Event) -> None:
    """Send 16 MiB every quarter second over a loopback connection until told to stop."""
    block = b"x" * 2**20
    with socket.create_server(("127.0.0.1", 0)) as server:
        receiver = threading.Thread(target=drain, args=(server,))
        receiver.start()
        with socket.create_connection(server.getsockname(), timeout=10) as client:
            while not stop.wait(0.25):
                for _ in range(16):
                    client.sendall(block)
        receiver.join(timeout=10)


def drain(server: socket.socket) -> None:
    connection, _ = server.accept()
    with connection:
        while connection.recv(1 << 20):
            pass


# -- inventory ---------------------------------------------------------------------------------


def test_a_running_managed_runtime_with_a_model_is_in_the_inventory(agent: RunningAgent) -> None:
    process = start_managed_simulator(agent, "inventory-managed")

    models = get(agent, "/agent/v1/models").json()["data"]
    http.delete(f"{agent.url}/agent/v1/processes/{process['id']}", headers=agent.headers())
    after_stop = get(agent, "/agent/v1/models").json()["data"]

    assert {
        "id": "inventory-managed",
        "runtime": "simulator",
        "base_url": f"http://127.0.0.1:{process['port']}/v1",
        "state": "loaded",
        "digest": None,
        "source": "managed",
        "process_id": process["id"],
    } in models
    assert "inventory-managed" not in [model["id"] for model in after_stop]


def test_a_process_without_a_model_is_not_in_the_inventory(agent: RunningAgent) -> None:
    process = http.post(
        f"{agent.url}/agent/v1/processes", headers=agent.headers(), json={"argv": ["sleep", "60"]}
    ).json()

    models = get(agent, "/agent/v1/models").json()["data"]
    http.delete(f"{agent.url}/agent/v1/processes/{process['id']}?grace=0", headers=agent.headers())

    assert process["id"] not in [model["process_id"] for model in models]


def test_watched_runtimes_report_their_models_and_states(tmp_path: Path) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}/v1"
    with (
        running_simulator("watched-warm", ttft_ms=0, tpot_ms=0) as warm,
        running_simulator("watched-cold", cold_start_s=60) as cold,
        running_agent(
            tmp_path,
            args=["--watch", warm.base_url, "--watch", cold.base_url + "/", "--watch", unreachable],
        ) as agent,
    ):
        started = time.monotonic()
        models = get(agent, "/agent/v1/models").json()["data"]
        took = time.monotonic() - started

    assert models == [
        {
            "id": "watched-warm",
            "runtime": "simulator",
            "base_url": warm.base_url,
            "state": "loaded",
            "digest": None,
            "source": "watched",
            "process_id": None,
        },
        {
            "id": "watched-cold",
            "runtime": "simulator",
            "base_url": cold.base_url,
            "state": "cold",
            "digest": None,
            "source": "watched",
            "process_id": None,
        },
    ]
    assert took < 3  # the unreachable runtime does not hold the answer up


# -- processes and jobs through the API ----------------------------------------------------------


def test_processes_are_started_listed_read_and_stopped_through_the_api(
    agent: RunningAgent,
) -> None:
    say = "print('one'); print('two'); print('three', flush=True); import time; time.sleep(60)"
    started = http.post(
        f"{agent.url}/agent/v1/processes",
        headers=agent.headers(),
        json={"argv": [sys.executable, "-c", say], "name": "talker"},
    )
    process = started.json()
    url = f"{agent.url}/agent/v1/processes/{process['id']}"

    wait_for(lambda: "three" in http.get(f"{url}/log", headers=agent.headers()).text, 10, "output")
    tail = http.get(f"{url}/log", headers=agent.headers(), params={"tail": 2})
    listed = get(agent, "/agent/v1/processes").json()["data"]
    stopped = http.delete(url, headers=agent.headers(), params={"grace": 5})

    assert started.status_code == 201
    assert (process["name"], process["state"]) == ("talker", "running")
    assert process["id"] in [p["id"] for p in listed]
    assert tail.headers["Content-Type"].startswith("text/plain")
    assert tail.text == "two\nthree\n"
    assert stopped.status_code == 200
    assert stopped.json()["state"] == "stopped"
    assert http.get(url, headers=agent.headers()).json()["state"] == "stopped"


@pytest.mark.parametrize(
    ("method", "suffix", "param", "value"),
    [
        ("GET", "/log", "tail", "many"),
        ("DELETE", "", "grace", "soon"),
        ("DELETE", "", "grace", "-1"),
    ],
)
def test_a_bad_query_parameter_is_refused_naming_it(
    agent: RunningAgent, method: str, suffix: str, param: str, value: str
) -> None:
    process = http.post(
        f"{agent.url}/agent/v1/processes", headers=agent.headers(), json={"argv": ["sleep", "60"]}
    ).json()
    url = f"{agent.url}/agent/v1/processes/{process['id']}"

    response = http.request(
        method, f"{url}{suffix}", headers=agent.headers(), params={param: value}
    )
    http.delete(url, headers=agent.headers(), params={"grace": 0})

    assert response.status_code == 400
    assert error_of(response)["message"].startswith(f"{param}: ")


def test_a_process_spec_the_manager_refuses_is_a_400_naming_the_field(agent: RunningAgent) -> None:
    response = http.post(f"{agent.url}/agent/v1/processes", headers=agent.headers(), json={})

    assert response.status_code == 400
    assert error_of(response) == {
        "message": "argv: required",
        "type": "invalid_request_error",
        "code": "invalid_request",
    }


def test_jobs_are_listed_in_a_data_envelope_and_a_bad_spec_is_refused(agent: RunningAgent) -> None:
    refused = http.post(
        f"{agent.url}/agent/v1/jobs", headers=agent.headers(), json={"kind": "teleport"}
    )
    listed = get(agent, "/agent/v1/jobs")

    assert refused.status_code == 400
    assert error_of(refused)["code"] == "invalid_request"
    assert listed.status_code == 200
    assert isinstance(listed.json()["data"], list)
