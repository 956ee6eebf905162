"""The controller's agent client against a real agent: answers, refusals, silence."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from nodes.agent.identity import fingerprint_of, verify_challenge
from nodes.client import AgentClient, AgentRefused, AgentUnreachable
from tests.nodes.fleet import SIM_MODEL, serve_simulator, stop_process
from tests.support.agent import RunningAgent
from tests.support.ports import free_port

WRONG = "not-the-node-secret"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung agent)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


def test_info_carries_a_signature_of_the_challenge_by_the_agents_key(
    agent_one: RunningAgent,
) -> None:
    with AgentClient(agent_one.url, agent_one.credential) as agent:
        info = agent.info("c0ffee")

    assert fingerprint_of(info["public_key"]) == agent_one.fingerprint == info["fingerprint"]
    assert verify_challenge(info["public_key"], "c0ffee", info["challenge_signature"])
    assert not verify_challenge(info["public_key"], "c0ffee00", info["challenge_signature"])
    assert info["resources"]["cpu_count"] >= 1


def test_it_lists_a_served_model_and_its_process(agent_one: RunningAgent) -> None:
    process_id = serve_simulator(agent_one, "client-model")
    try:
        with AgentClient(agent_one.url, agent_one.credential) as agent:
            models = {model["id"]: model for model in agent.models()}
            processes = [process["id"] for process in agent.processes()]
            log = agent.process_log(process_id, tail=5)
            metrics = agent.metrics()
    finally:
        stop_process(agent_one, process_id)

    assert models["client-model"]["process_id"] == process_id
    assert models["client-model"]["source"] == "managed"
    assert process_id in processes
    assert "listening on" in log
    assert "memory_total_bytes" in metrics["node"]


def test_stopping_a_process_returns_it_stopped(agent_one: RunningAgent) -> None:
    process_id = serve_simulator(agent_one, SIM_MODEL + "-stop")

    with AgentClient(agent_one.url, agent_one.credential) as agent:
        stopped = agent.stop_process(process_id, grace_s=2)
        again = agent.process(process_id)

    assert stopped["state"] == again["state"] == "stopped"


def test_a_wrong_credential_is_refused_in_plain_words(agent_one: RunningAgent) -> None:
    with AgentClient(agent_one.url, WRONG) as agent, pytest.raises(AgentRefused) as refused:
        agent.info()

    assert refused.value.status == 401
    assert refused.value.code == "invalid_credential"
    assert str(refused.value) == "the agent refused the node credential"


def test_an_agent_error_keeps_its_code_and_message(agent_one: RunningAgent) -> None:
    agent = AgentClient(agent_one.url, agent_one.credential)
    with agent, pytest.raises(AgentRefused) as refused:
        agent.job("no-such-job")

    assert refused.value.status == 404
    assert refused.value.code == "job_not_found"


def test_a_closed_port_is_connection_refused() -> None:
    agent = AgentClient(f"http://127.0.0.1:{free_port()}", WRONG)
    with agent, pytest.raises(AgentUnreachable) as silent:
        agent.info()

    assert silent.value.reason == "connection refused"


def test_a_silent_agent_times_out_after_the_timeout(silent_port: int) -> None:
    agent = AgentClient(f"http://127.0.0.1:{silent_port}", WRONG, timeout_s=0.5)
    with agent, pytest.raises(AgentUnreachable) as silent:
        agent.metrics()

    assert silent.value.reason == "timed out after 0.5 s"
    assert WRONG not in repr(silent.value)
