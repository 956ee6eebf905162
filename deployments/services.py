"""Deployments' domain operations: create one, run one node's part, retry the failed nodes,
resume the parts whose worker was lost.

The only entry other apps and the shells (API, pages, tasks) use. A deployment never touches
pools: serving a deployed model through a pool is the operator's own, separate step.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from deployments import live
from deployments.models import (
    LOG_LINES,
    Deployment,
    DeploymentNode,
    ModelSource,
    NodeState,
    Runtime,
    sha256_validator,
)
from nodes import services as node_services
from nodes.client import AgentClient, AgentRefused, AgentUnreachable
from nodes.models import Node, NodeModel, NodeStatus, NodeTrust

logger = logging.getLogger(__name__)

# How often a running job is polled, and how long its agent may stay silent before the node's
# part fails: a crashed agent is noticed within seconds, a brief hiccup is not a failure.
POLL_INTERVAL_S = 0.5
UNREACHABLE_AFTER_S = 5.0
# A running row's follower touches it at least this often, even when nothing changed; a row left
# untouched for STALLED_AFTER_S lost its follower (a worker killed, a controller restarted).
HEARTBEAT_S = 10.0
STALLED_AFTER_S = 60.0
# The job fields copied onto the node row as they change.
PROGRESS_FIELDS = ("phase", "bytes_done", "bytes_total", "percent", "message")
_HF_REPO = re.compile(r"^[\w.-]+/[\w.-]+$")


class CannotRetry(Exception):
    """Nothing to retry: no node of the deployment failed."""


def create_deployment(
    *,
    name: str,
    nodes: Iterable[Node],
    runtime: str,
    model_source: str,
    model_location: str,
    model_name: str,
    model_file: str = "",
    model_sha256: str = "",
    runtime_requirement: str = "",
    runtime_argv: Sequence[str] = (),
    user: User | None = None,
) -> Deployment:
    """Create a deployment with a pending row per node; each node's job is queued on commit.

    Raises ValidationError (keyed by field) when a node is not trusted and online or when the
    runtime and model source do not fit together.
    """
    nodes = list(nodes)
    deployment = Deployment(
        name=name.strip(),
        runtime=runtime,
        runtime_requirement=runtime_requirement.strip(),
        runtime_argv=[str(arg) for arg in runtime_argv],
        model_source=model_source,
        model_location=model_location.strip(),
        model_file=model_file.strip(),
        model_sha256=model_sha256.strip().lower(),
        model_name=model_name.strip(),
        created_by=user if user is not None and user.is_authenticated else None,
    )
    errors = _deployment_errors(deployment) | _node_errors(nodes)
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        deployment.save()
        rows = [DeploymentNode.objects.create(deployment=deployment, node=node) for node in nodes]
        for row in rows:
            transaction.on_commit(partial(enqueue, row.pk))
    return deployment


def _deployment_errors(deployment: Deployment) -> dict[str, list[str]]:
    """Return what is wrong with the runtime and the model source, by field."""
    errors: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    if not deployment.name:
        add("name", "Name the deployment.")
    if deployment.runtime not in Runtime.values:
        add("runtime", f"Choose one of: {', '.join(Runtime.values)}.")
    if deployment.model_source not in ModelSource.values:
        add("model_source", f"Choose one of: {', '.join(ModelSource.values)}.")
    if not deployment.model_name:
        add("model_name", "Name the model id the runtime serves.")
    if deployment.model_sha256:
        try:
            sha256_validator(deployment.model_sha256)
        except ValidationError as invalid:
            add("model_sha256", invalid.messages[0])

    if deployment.runtime == Runtime.CUSTOM and not any(
        "${PORT}" in arg for arg in deployment.runtime_argv
    ):
        # The agent learns where the runtime listens only by giving it the port.
        add("runtime_argv", "A custom runtime's command must contain ${PORT}, where it listens.")
    if deployment.runtime != Runtime.CUSTOM and deployment.runtime_argv:
        add("runtime_argv", "Only a custom runtime takes a command; the others have their own.")
    if deployment.runtime != Runtime.CUSTOM and deployment.runtime_requirement:
        # The agent installs the named runtimes itself and refuses a requirement for them.
        add("runtime_requirement", "Only a custom runtime takes a requirement.")

    location = deployment.model_location
    if not location:
        add("model_location", "Say where the model comes from.")
    elif deployment.model_source == ModelSource.PATH and not location.startswith("/"):
        add("model_location", "Give an absolute path on the node.")
    elif deployment.model_source == ModelSource.HTTP and not re.match(r"^https?://\S+$", location):
        add("model_location", "Give an http:// or https:// URL.")
    elif deployment.model_source == ModelSource.HF and not _HF_REPO.match(location):
        add("model_location", "Give a Hugging Face repository as org/repo.")
    if deployment.model_source == ModelSource.PATH and deployment.model_file:
        add("model_file", "A path names its file itself; only http and hf sources take one.")
    if deployment.model_source == ModelSource.HF and not deployment.model_file:
        if deployment.model_sha256:
            add("model_file", "A SHA-256 checks one file: name it in the repository.")
        if deployment.runtime == Runtime.LLAMA_CPP:
            add("model_file", "llama.cpp serves one .gguf file: name it in the repository.")
    return errors


def _node_errors(nodes: Sequence[Node]) -> dict[str, list[str]]:
    """Return why the nodes cannot take the deployment: none named, or one not usable."""
    if not nodes:
        return {"nodes": ["Choose at least one node."]}
    problems = [f"{node.unusable_reason()}." for node in nodes if not node.is_usable]
    names = [node.name for node in nodes]
    problems += [
        f"node {n} is named twice." for n in sorted({n for n in names if names.count(n) > 1})
    ]
    return {"nodes": problems} if problems else {}


def enqueue(row_id: int) -> None:
    """Queue a node's job; a broker that cannot take it fails the row, saying why."""
    # Imported here: tasks import this module, and the task is only a name for the broker.
    from deployments.tasks import run_deployment_node

    try:
        run_deployment_node.delay(row_id)
    except Exception as error:
        logger.warning("could not queue deployment node %s", row_id, exc_info=True)
        _finish(row_id, NodeState.FAILED, error=f"could not queue the job: {error}")


def retry_failed(deployment: Deployment) -> list[DeploymentNode]:
    """Put the deployment's failed nodes back to pending, one attempt more, and queue them.

    Nodes that succeeded or are still running are left alone. Raises CannotRetry when no node
    failed, and ValidationError when a failed node is no longer trusted.
    """
    with transaction.atomic():
        rows = list(
            deployment.nodes.select_for_update()
            .filter(state=NodeState.FAILED)
            .select_related("node")
        )
        if not rows:
            raise CannotRetry("No node of this deployment failed; there is nothing to retry.")
        untrusted = [row.node.name for row in rows if row.node.trust != NodeTrust.TRUSTED]
        if untrusted:
            raise ValidationError(
                {"nodes": [f"node {name} is no longer trusted." for name in untrusted]}
            )
        for row in rows:
            row.state = NodeState.PENDING
            row.attempt += 1
            row.phase = row.message = row.error = row.agent_job_id = ""
            row.started_at = row.finished_at = None
            # The bytes stay until the new job reports: the node keeps the part it downloaded.
            row.save()
            transaction.on_commit(partial(enqueue, row.pk))
            transaction.on_commit(partial(live.node_changed, row.pk), robust=True)
    return rows


def run_node(row_id: int) -> str:
    """Run one node's part: submit the deploy job to its agent and follow it to the end.

    Claimed with a conditional UPDATE, so a second delivery of the same task does nothing.
    Returns a one-word summary for the task's log.
    """
    claimed = DeploymentNode.objects.filter(pk=row_id, state=NodeState.PENDING).update(
        state=NodeState.RUNNING,
        started_at=timezone.now(),
        finished_at=None,
        updated_at=timezone.now(),
    )
    if not claimed:
        return "skipped"
    return _drive(row_id)


def resume_stalled() -> int:
    """Find running rows whose follower stopped touching them, claim each, and queue its resume.

    The claim is a conditional UPDATE of `updated_at`: of two beats that saw the same stalled row,
    only one claims it, and the resume task takes over only from the claim it was queued with.
    Returns how many rows were queued.
    """
    cutoff = timezone.now() - timedelta(seconds=STALLED_AFTER_S)
    stalled = DeploymentNode.objects.filter(state=NodeState.RUNNING, updated_at__lt=cutoff)
    queued = 0
    for row_id in stalled.values_list("pk", flat=True):
        claimed_at = timezone.now()
        claimed = DeploymentNode.objects.filter(
            pk=row_id, state=NodeState.RUNNING, updated_at__lt=cutoff
        ).update(updated_at=claimed_at)
        if claimed and _enqueue_resume(row_id, claimed_at):
            queued += 1
    return queued


def _enqueue_resume(row_id: int, claimed_at: datetime) -> bool:
    """Queue a row's resume; a broker that cannot take it leaves the row for the next beat."""
    # Imported here: tasks import this module, and the task is only a name for the broker.
    from deployments.tasks import resume_deployment_node

    try:
        resume_deployment_node.delay(row_id, claimed_at.isoformat())
    except Exception:
        logger.warning("could not queue the resume of deployment node %s", row_id, exc_info=True)
        return False
    logger.info("deployment node %s lost its follower; resuming it", row_id)
    return True


def resume_node(row_id: int, claimed_at: datetime) -> str:
    """Follow a stalled node's part again: the agent job it recorded, else a new one.

    Takes over only while the row is still as `resume_stalled` claimed it: a second delivery, or
    a follower that came back to life meanwhile, has touched it since, and this does nothing.
    The attempt stays: it is the same attempt, only followed by another worker.
    """
    taken = DeploymentNode.objects.filter(
        pk=row_id, state=NodeState.RUNNING, updated_at=claimed_at
    ).update(updated_at=timezone.now())
    if not taken:
        return "skipped"
    return _drive(row_id)


def _drive(row_id: int) -> str:
    """Follow a claimed running row's agent job to the end, submitting it first if it has none."""
    row = DeploymentNode.objects.select_related("deployment", "node").get(pk=row_id)
    live.node_changed(row.pk)
    node = row.node
    with node.client() as agent:
        if row.agent_job_id:
            # Resumed: the job ran on in the agent meanwhile; its next poll says where it is.
            job: dict[str, Any] = {"id": row.agent_job_id, "state": "running", "phase": row.phase}
        else:
            try:
                job = agent.submit_job(row.deployment.job_spec())
            except AgentUnreachable as error:
                return _finish(
                    row.pk,
                    NodeState.FAILED,
                    error=f"node {node.name} did not answer: {error.reason}",
                )
            except AgentRefused as error:
                return _finish(
                    row.pk,
                    NodeState.FAILED,
                    error=f"node {node.name} refused the job: {error.message}",
                )
            if not _save(row.pk, {"agent_job_id": str(job["id"]), **_progress(job)}):
                return "gone"
        followed = _follow(agent, node, row.pk, job)
    if followed is None:
        ended = DeploymentNode.objects.filter(pk=row.pk).values_list("state", flat=True)
        return ended.first() or "gone"
    if followed.get("state") != "succeeded":
        cause = followed.get("error") or f"the job ended {followed.get('state')} without saying why"
        return _finish(row.pk, NodeState.FAILED, error=cause)
    return _check_inventory(row.pk, node, row.deployment.model_name)


def _follow(
    agent: AgentClient, node: Node, row_id: int, job: dict[str, Any]
) -> dict[str, Any] | None:
    """Poll the job until it ends and return it; None once the node's part has failed or its row
    is gone (deleted with its deployment). The row is touched at least every HEARTBEAT_S, so that
    `resume_stalled` can tell a followed row from one whose worker was lost."""
    silent_since: float | None = None
    touched = time.monotonic()
    while job.get("state") == "running":
        time.sleep(POLL_INTERVAL_S)
        try:
            job = agent.job(job["id"])
        except AgentUnreachable as error:
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since < UNREACHABLE_AFTER_S:
                continue
            reason = f"node {node.name} stopped answering while {job.get('phase') or 'working'}"
            _finish(row_id, NodeState.FAILED, error=f"{reason}: {error.reason}")
            return None
        except AgentRefused as error:
            _finish(
                row_id, NodeState.FAILED, error=f"node {node.name} lost the job: {error.message}"
            )
            return None
        silent_since = None
        touch = time.monotonic() - touched >= HEARTBEAT_S
        if touch:
            touched = time.monotonic()
        if not _save(row_id, _progress(job), touch=touch):
            return None
    return job


def _check_inventory(row_id: int, node: Node, model_name: str) -> str:
    """Refresh the node and succeed only when the model is in its inventory."""
    node = node_services.refresh_node(node)
    if node.status != NodeStatus.ONLINE:
        reason = f"node {node.name} stopped answering after the job succeeded"
        return _finish(row_id, NodeState.FAILED, error=f"{reason}: {node.last_error}")
    if NodeModel.objects.filter(node=node, model_id=model_name).exists():
        return _finish(row_id, NodeState.SUCCEEDED, message=f"{model_name} is served")
    return _finish(
        row_id, NodeState.FAILED, error=f"the model did not appear in {node.name}'s inventory"
    )


def _progress(job: dict[str, Any]) -> dict[str, Any]:
    """Return the row fields an agent job's state sets."""
    fields = {name: job.get(name) for name in PROGRESS_FIELDS if name in job}
    fields["bytes_done"] = fields.get("bytes_done") or 0
    fields["phase"] = fields.get("phase") or ""
    fields["message"] = (fields.get("message") or "")[:500]
    fields["log"] = [str(line) for line in (job.get("log") or [])][-LOG_LINES:]
    return fields


def _save(row_id: int, fields: dict[str, Any], *, touch: bool = False) -> bool:
    """Store what changed on the row and push it to open pages; False when the row is gone.

    `touch` saves `updated_at` even when nothing changed: the follower's heartbeat.
    """
    row = DeploymentNode.objects.filter(pk=row_id).first()
    if row is None:
        return False
    changed = {name: value for name, value in fields.items() if getattr(row, name) != value}
    if changed or touch:
        DeploymentNode.objects.filter(pk=row_id).update(**changed, updated_at=timezone.now())
    if changed:
        live.node_changed(row_id)
    return True


def _finish(row_id: int, state: NodeState, *, error: str = "", message: str = "") -> str:
    """End the node's part in a final state, saying why, and push it; return the state."""
    fields: dict[str, Any] = {"state": state, "error": error, "finished_at": timezone.now()}
    if message:
        fields["message"] = message
    if state == NodeState.SUCCEEDED:
        fields["percent"] = 100.0
    _save(row_id, fields)
    return str(state)
