"""The controller's agent client against a real agent: answers, refusals, silence."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

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


@pytest.fixture
def self_signed_tls_port(tmp_path: Path) -> Iterator[int]:
    """A port whose server speaks TLS with a self-signed certificate for 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")

    def serve(server: socket.socket) -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # the fixture closed the socket
                return
            # The client gives up on the certificate during the handshake.
            with connection, contextlib.suppress(ssl.SSLError, OSError):
                context.wrap_socket(connection, server_side=True).close()

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        serving = threading.Thread(target=serve, args=(server,), daemon=True)
        serving.start()
        yield server.getsockname()[1]
        server.shutdown(socket.SHUT_RDWR)
    serving.join(timeout=5)


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


def test_an_agent_behind_a_certificate_no_authority_signed_is_refused_every_time(
    self_signed_tls_port: int,
) -> None:
    # Every client of the process shares one TLS context (built once): each still verifies.
    for _ in range(2):
        agent = AgentClient(f"https://127.0.0.1:{self_signed_tls_port}", WRONG, timeout_s=5)
        with agent, pytest.raises(AgentUnreachable) as refused:
            agent.info()

        assert "CERTIFICATE_VERIFY_FAILED" in refused.value.reason
        assert WRONG not in repr(refused.value)
