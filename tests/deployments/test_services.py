"""Deployments' services: what a deployment accepts, the rows it makes, and what retry touches."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from kombu.exceptions import OperationalError

from deployments import services, tasks
from deployments.models import Deployment, DeploymentNode, DeploymentState, NodeState
from nodes.models import Node, NodeStatus, NodeTrust
from tests.deployments.factories import SHA256, make_deployment, make_node
from tests.support.ports import free_port

pytestmark = pytest.mark.django_db


def deploy(nodes: list[Node], **fields: Any) -> Deployment:
    """Create a deployment of the simulator from an HTTP URL, with the given changes."""
    asked: dict[str, Any] = {
        "name": "demo",
        "runtime": "simulator",
        "model_source": "http",
        "model_location": "http://files.lan/demo.bin",
        "model_name": "demo-1b",
        **fields,
    }
    return services.create_deployment(nodes=nodes, **asked)


def refusal(nodes: list[Node], **fields: Any) -> dict[str, list[str]]:
    """Return the errors creating such a deployment raises, by field."""
    with pytest.raises(ValidationError) as refused:
        deploy(nodes, **fields)
    assert not Deployment.objects.exists()
    return refused.value.message_dict


def test_it_creates_a_pending_row_per_node_and_queues_each_once_committed(
    django_capture_on_commit_callbacks,
) -> None:
    gpu_a, gpu_b = make_node("gpu-a"), make_node("gpu-b")

    with django_capture_on_commit_callbacks() as queued:
        deployment = deploy([gpu_a, gpu_b], model_sha256=SHA256.upper())

    rows = list(deployment.nodes.order_by("node__name"))
    assert [(row.node.name, row.state, row.attempt) for row in rows] == [
        ("gpu-a", NodeState.PENDING, 1),
        ("gpu-b", NodeState.PENDING, 1),
    ]
    assert [callback.args for callback in queued] == [(rows[0].pk,), (rows[1].pk,)]
    assert deployment.model_sha256 == SHA256
    assert deployment.state == DeploymentState.RUNNING


def test_it_refuses_a_node_waiting_for_confirmation_and_names_it() -> None:
    gpu_a = make_node("gpu-a")
    gpu_b = make_node("gpu-b", trust=NodeTrust.PENDING)

    errors = refusal([gpu_a, gpu_b])

    assert errors == {"nodes": ["node gpu-b is not trusted (pending confirmation)."]}


def test_it_refuses_an_offline_node_and_names_it() -> None:
    errors = refusal([make_node("gpu-a", status=NodeStatus.OFFLINE)])

    assert errors == {"nodes": ["node gpu-a is offline."]}


def test_it_needs_at_least_one_node_and_each_only_once() -> None:
    gpu_a = make_node("gpu-a")

    assert refusal([]) == {"nodes": ["Choose at least one node."]}
    assert refusal([gpu_a, gpu_a]) == {"nodes": ["node gpu-a is named twice."]}


@pytest.mark.parametrize(
    ("fields", "errors"),
    [
        ({"model_sha256": "abc"}, {"model_sha256": ["Give 64 hexadecimal digits."]}),
        (
            {"runtime": "custom", "runtime_argv": ["my-server", "${MODEL_PATH}"]},
            {
                "runtime_argv": [
                    "A custom runtime's command must contain ${PORT}, where it listens."
                ]
            },
        ),
        (
            {"runtime_argv": ["my-server", "${PORT}"]},
            {"runtime_argv": ["Only a custom runtime takes a command; the others have their own."]},
        ),
        (
            {"runtime": "vllm", "runtime_requirement": "vllm==0.6"},
            {"runtime_requirement": ["Only a custom runtime takes a requirement."]},
        ),
        (
            {"model_location": "files.lan/demo.bin"},
            {"model_location": ["Give an http:// or https:// URL."]},
        ),
        (
            {"model_source": "path", "model_location": "models/demo.bin"},
            {"model_location": ["Give an absolute path on the node."]},
        ),
        (
            {"model_source": "hf", "model_location": "not a repo"},
            {"model_location": ["Give a Hugging Face repository as org/repo."]},
        ),
        (
            {"runtime": "llama-cpp", "model_source": "hf", "model_location": "org/repo"},
            {"model_file": ["llama.cpp serves one .gguf file: name it in the repository."]},
        ),
        ({"model_name": " "}, {"model_name": ["Name the model id the runtime serves."]}),
    ],
)
def test_it_refuses_a_runtime_and_source_that_do_not_fit(
    fields: dict[str, Any], errors: dict[str, list[str]]
) -> None:
    assert refusal([make_node("gpu-a")], **fields) == errors


def test_the_job_spec_is_the_agents_deploy_job() -> None:
    hf = deploy(
        [make_node("gpu-a")],
        model_source="hf",
        model_location="org/tiny",
        model_file="tiny.gguf",
        model_sha256=SHA256,
    )
    custom = deploy(
        [make_node("gpu-b")],
        runtime="custom",
        runtime_requirement="my-server==1.2",
        runtime_argv=["my-server", "${MODEL_PATH}", "--port", "${PORT}"],
    )

    assert hf.job_spec() == {
        "kind": "deploy",
        "runtime": {"name": "simulator"},
        "model": {
            "source": "hf",
            "location": "org/tiny",
            "file": "tiny.gguf",
            "sha256": SHA256,
            "name": "demo-1b",
        },
    }
    assert custom.job_spec() == {
        "kind": "deploy",
        "runtime": {
            "name": "custom",
            "requirement": "my-server==1.2",
            "argv": ["my-server", "${MODEL_PATH}", "--port", "${PORT}"],
        },
        "model": {
            "source": "http",
            "location": "http://files.lan/demo.bin",
            "sha256": None,
            "name": "demo-1b",
        },
    }


def test_the_overall_state_follows_the_node_rows() -> None:
    a, b = make_node("gpu-a"), make_node("gpu-b")
    running = make_deployment("one", {a: NodeState.FAILED, b: NodeState.RUNNING})
    failed = make_deployment("two", {a: NodeState.FAILED, b: NodeState.SUCCEEDED})
    succeeded = make_deployment("three", {a: NodeState.SUCCEEDED, b: NodeState.SUCCEEDED})

    assert [running.state, failed.state, succeeded.state] == ["running", "failed", "succeeded"]


def test_retry_puts_only_the_failed_nodes_back_one_attempt_more(
    django_capture_on_commit_callbacks,
) -> None:
    a, b, c = make_node("gpu-a"), make_node("gpu-b"), make_node("gpu-c")
    deployment = make_deployment(
        "demo", {a: NodeState.SUCCEEDED, b: NodeState.FAILED, c: NodeState.RUNNING}
    )
    DeploymentNode.objects.filter(node=b).update(bytes_done=1234, phase="downloading")

    with django_capture_on_commit_callbacks() as queued:
        retried = services.retry_failed(deployment)

    rows = {row.node.name: row for row in deployment.nodes.all()}
    assert [row.node.name for row in retried] == ["gpu-b"]
    assert (rows["gpu-b"].state, rows["gpu-b"].attempt, rows["gpu-b"].error) == ("pending", 2, "")
    assert rows["gpu-b"].bytes_done == 1234
    assert (rows["gpu-a"].state, rows["gpu-a"].attempt) == ("succeeded", 1)
    assert (rows["gpu-c"].state, rows["gpu-c"].attempt) == ("running", 1)
    assert [callback.args for callback in queued if callback.func is services.enqueue] == [
        (rows["gpu-b"].pk,)
    ]


def test_retry_refuses_when_no_node_failed() -> None:
    deployment = make_deployment("demo", {make_node("gpu-a"): NodeState.SUCCEEDED})

    with pytest.raises(services.CannotRetry, match="No node of this deployment failed"):
        services.retry_failed(deployment)


def test_retry_refuses_a_node_no_longer_trusted() -> None:
    node = make_node("gpu-a")
    deployment = make_deployment("demo", {node: NodeState.FAILED})
    Node.objects.filter(pk=node.pk).update(trust=NodeTrust.REJECTED)

    with pytest.raises(ValidationError) as refused:
        services.retry_failed(deployment)

    assert refused.value.message_dict == {"nodes": ["node gpu-a is no longer trusted."]}
    assert deployment.nodes.get().state == NodeState.FAILED


def test_a_second_delivery_of_a_claimed_row_does_nothing() -> None:
    deployment = make_deployment("demo", {make_node("gpu-a"): NodeState.RUNNING})

    assert services.run_node(deployment.nodes.get().pk) == "skipped"
    assert services.run_node(10_000) == "skipped"


def test_a_node_that_does_not_answer_the_submission_fails_saying_so() -> None:
    node = make_node("gpu-a", address=f"http://127.0.0.1:{free_port()}")
    row = make_deployment("demo", {node: NodeState.PENDING}).nodes.get()

    assert tasks.run_deployment_node(row.pk) == "failed"

    row.refresh_from_db()
    assert row.state == NodeState.FAILED
    assert row.error == "node gpu-a did not answer: connection refused"
    assert row.started_at is not None and row.finished_at is not None


def test_a_broker_that_cannot_take_the_job_fails_the_row(monkeypatch) -> None:
    def refuse(*args: object) -> None:
        raise OperationalError("Error 111 connecting to redis")

    monkeypatch.setattr(tasks.run_deployment_node, "delay", refuse)
    row = make_deployment("demo", {make_node("gpu-a"): NodeState.PENDING}).nodes.get()

    services.enqueue(row.pk)

    row.refresh_from_db()
    assert row.state == NodeState.FAILED
    assert row.error == "could not queue the job: Error 111 connecting to redis"
