"""Validate: a trial replica of a launcher's settings, run to a verdict and always stopped.

`start_trial` checks the settings as a new service's (the name aside), keeps them on a Trial row
and queues `run_trial` for the worker. `run_trial` places the replica on a node of the group that
fits (the scheduler, as for a route), starts its process through the agent, then until a verdict
reads its log and probes it as its health check says (initial delay, interval, max retries,
expected status): the first passing probe passes it; max_retries + 1 failed probes in a row, an
exited process or the time limit fail it, with the reason. The process is stopped whatever
happens. Every change is pushed to the trial's popup (topic `trial-<id>`, staff only).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from nexus import live
from nodes import services as node_services
from nodes.client import AgentRefused, AgentUnreachable
from nodes.models import Node
from serving import replicas, services
from serving.health import HealthCheck
from serving.models import Revision, Route, Service, Trial, TrialState
from serving.scheduler import Candidate, schedule

logger = logging.getLogger(__name__)

TRIAL_POPUP = "serving/trial.html#trial-body"
# However the health check is set, a trial gives up after this long (the popup waits on it).
MAX_TRIAL_S = 900.0
# How often the log is read and the popup refreshed between probes.
WATCH_EVERY_S = 1.0
LOG_LINES = 200
MAX_PROBES_KEPT = 200
STOP_GRACE_S = 5.0


class TrialRefused(Exception):
    """The trial could not run; the message is its reason."""


def topic(trial_id: int) -> str:
    """Return the live topic of one trial's popup."""
    return f"trial-{trial_id}"


def start_trial(owner: Any, **declaration: Any) -> Trial:
    """Check the settings as a new service's and queue their trial; raise ServiceError with
    every problem, as creating the service would."""
    plan = services.check_service(owner=owner, naming=False, **declaration)
    if plan.cluster_size > 1:
        raise TrialRefused("Validate runs single-node replicas; set the cluster size to 1.")
    trial = Trial.objects.create(
        project=plan.project,
        created_by=owner,
        model_folder=plan.model_folder,
        mount_destination=plan.launch.mount_destination,
        runtime_variant=plan.runtime_variant,
        resource_group=plan.resource_group,
        resource_slots=plan.resource_slots,
        spec=plan.launch.spec,
    )
    from serving.tasks import run_trial  # the tasks import this module

    transaction.on_commit(lambda: run_trial.delay(trial.pk))
    return trial


def run_trial(trial_id: int) -> str:
    """Run a queued trial to its verdict, always stopping its process; return its state."""
    claimed = Trial.objects.filter(pk=trial_id, state=TrialState.QUEUED).update(
        state=TrialState.RUNNING, started_at=timezone.now()
    )
    if not claimed:
        return "gone"
    trial = Trial.objects.select_related("model_folder", "resource_group").get(pk=trial_id)
    pushed(trial)
    node: Node | None = None
    state, reason, unstopped = TrialState.FAILED, "the trial was interrupted", ""
    try:
        node = place(trial)
        start(trial, node)
        state, reason = watch(trial, node)
    except TrialRefused as refused:
        reason = str(refused)
    except Exception as error:  # the trial must end, and say so, whatever broke
        logger.exception("trial %s broke", trial_id)
        reason = f"the trial broke: {error}"
    finally:
        if node is not None and trial.process_id:
            unstopped = stop(trial, node)
        finish(trial, state, reason + unstopped)
    return str(state)


def place(trial: Trial) -> Node:
    """Return the usable node of the trial's group that fits its need best."""
    group = trial.resource_group
    if group is None:
        raise TrialRefused("its resource group was deleted")
    nodes = node_services.usable_nodes()
    if not group.all_nodes:
        nodes = nodes.filter(resource_groups=group)
    candidates = []
    by_name = {}
    for node in nodes.order_by("name"):
        try:
            with node.client() as agent:
                info = agent.info()
        except (AgentUnreachable, AgentRefused) as error:
            logger.info("not trying node %s: %s", node.name, error)
            continue
        candidates.append(Candidate(node.name, info.get("free") or {}))
        by_name[node.name] = node
    if not candidates:
        raise TrialRefused(f"no usable node in {group.name} answers")
    placed = schedule(1, candidates, replicas.resource_need(as_revision(trial)), group.name)
    if not placed.placements:
        raise TrialRefused(placed.reason)
    return by_name[placed.placements[0].node]


def as_revision(trial: Trial) -> Revision:
    """Return the trial's launch as an unsaved revision, which the replica helpers read."""
    return Revision(
        number=0,
        model_folder=trial.model_folder,
        mount_destination=trial.mount_destination,
        runtime_variant=trial.runtime_variant,
        resource_slots=trial.resource_slots,
        spec=trial.spec,
    )


def start(trial: Trial, node: Node) -> None:
    """Start the trial's process on the node; keep where it runs."""
    if trial.model_folder is None:
        raise TrialRefused("its model folder was deleted")
    # An unsaved route of an unsaved service: the process spec a route of these settings gets.
    route = Route(
        pk=trial.pk, service=Service(name=f"trial{trial.pk}"), revision=as_revision(trial)
    )
    route.node = node
    # Not a route's name (`replicas.process_name`), so the orphan sweep leaves it to its trial.
    body = {**replicas.process_spec(route), "name": f"nexus-trial-{trial.pk}"}
    try:
        with node.client() as agent:
            record = agent.start_process(body)
    except AgentUnreachable as error:
        raise TrialRefused(f"node {node.name} did not answer: {error.reason}") from None
    except AgentRefused as error:
        raise TrialRefused(f"node {node.name} refused it: {error.message}") from None
    trial.node = node
    trial.process_id = str(record["id"])
    trial.port = record.get("port")
    trial.save(update_fields=["node", "process_id", "port"])
    pushed(trial)


def watch(trial: Trial, node: Node) -> tuple[TrialState, str]:
    """Follow the process until a verdict: its log read and its probes sent on schedule."""
    check = HealthCheck.from_spec(trial.spec.get("health_check"), tick_s=WATCH_EVERY_S)
    path = "/" if check.path is None else check.path
    begun = time.monotonic()
    next_probe = begun + check.initial_delay
    limit = min(MAX_TRIAL_S, check.initial_delay + check.interval * (check.max_retries + 1) + 30)
    failed_in_a_row = 0
    with node.client() as agent:
        while True:
            record = agent.process(trial.process_id)
            read_log(trial, agent)
            if record.get("state") != "running":
                code = record.get("exit_code")
                return TrialState.FAILED, f"the process exited with code {code}"
            now = time.monotonic()
            if now >= next_probe:
                passed, detail = probe(agent, trial.process_id, path, check)
                note_probe(trial, passed, detail)
                if passed:
                    return TrialState.PASSED, f"{path} answered {detail}"
                failed_in_a_row += 1
                if failed_in_a_row > check.max_retries:
                    return TrialState.FAILED, (
                        f"{failed_in_a_row} health probes of {path} failed in a row; "
                        f"the last: {detail}"
                    )
                next_probe = now + check.interval
            if now - begun > limit:
                return TrialState.FAILED, f"no verdict within {limit:g} s"
            pushed(trial)
            time.sleep(min(WATCH_EVERY_S, max(next_probe - time.monotonic(), 0.05)))


def probe(agent: Any, process_id: str, path: str, check: HealthCheck) -> tuple[bool, str]:
    """Send one health probe; return whether it passed and what it found."""
    try:
        status = agent.process_http_status(process_id, path, check.max_wait_time)
    except AgentUnreachable as error:
        return False, error.reason
    if check.checks_port:
        # The port check passes on any answer of the process itself (not the agent's 502).
        return status < 500, f"HTTP {status}"
    return status == check.expected_status_code, (
        f"HTTP {status}"
        + (
            ""
            if status == check.expected_status_code
            else f" (expected {check.expected_status_code})"
        )
    )


def read_log(trial: Trial, agent: Any) -> None:
    """Keep the tail of the process's output."""
    try:
        trial.log = agent.process_log(trial.process_id, tail=LOG_LINES)
    except (AgentUnreachable, AgentRefused) as error:
        logger.info("cannot read the log of trial %s: %s", trial.pk, error)
        return
    trial.save(update_fields=["log"])


def note_probe(trial: Trial, passed: bool, detail: str) -> None:
    """Keep a probe's outcome, the latest MAX_PROBES_KEPT."""
    trial.probes = [
        *trial.probes,
        {"at": timezone.now().isoformat(), "passed": passed, "detail": detail},
    ][-MAX_PROBES_KEPT:]
    trial.save(update_fields=["probes"])


def stop(trial: Trial, node: Node) -> str:
    """Stop the trial's process, keeping its last output; return "" or why it still runs."""
    try:
        with node.client() as agent:
            read_log(trial, agent)
            agent.stop_process(trial.process_id, grace_s=STOP_GRACE_S)
    except (AgentUnreachable, AgentRefused) as error:
        logger.warning("could not stop trial %s on %s: %s", trial.pk, node.name, error)
        return f"; its process {trial.process_id} on {node.name} could not be stopped: {error}"
    return ""


def finish(trial: Trial, state: str, reason: str) -> None:
    """Keep the verdict and tell the popups."""
    trial.state = state
    trial.reason = reason
    trial.finished_at = timezone.now()
    trial.save(update_fields=["state", "reason", "finished_at"])
    pushed(trial)


_last_pushed: dict[int, str] = {}


def pushed(trial: Trial) -> None:
    """Push the trial's popup body to its open popups when it reads differently."""
    html = live.fragment(TRIAL_POPUP, {"trial": trial})
    if _last_pushed.get(trial.pk) == html:
        return
    _last_pushed[trial.pk] = html
    if trial.finished:
        _last_pushed.pop(trial.pk, None)
    live.push(topic(trial.pk), "trial", html, audience="manage")
