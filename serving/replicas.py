"""Replicas on nodes: start a route's process through its node's agent, stop it, read its state.

A route's process is its revision's `spec` with the mount destination mapped to the model
folder's real path (docs/services.md, "Replicas through the agent"). Every change of a route's
state is a conditional UPDATE on the state it was seen in, because the health probes move routes
too: a route that left that state meanwhile is left as the other writer made it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from django.utils import timezone

from nodes.client import AgentRefused, AgentUnreachable
from nodes.models import Node
from nodes.runtimes import fill_cluster_placeholders
from serving import folder_sync
from serving.folders import FolderError
from serving.models import ModelFolder, Revision, Route, RoutePart, RouteState
from serving.scheduler import Need

logger = logging.getLogger(__name__)

DEFAULT_MOUNT = "/models"
MIB = 1024 * 1024
# How long a stopped replica may finish its requests after SIGTERM before SIGKILL.
STOP_GRACE_S = 10.0
MAX_BACKOFF_S = 60
# Errors kept on a route (a crash loop carries them from route to route); the oldest go first.
MAX_ERRORS = 50
ENDED = (RouteState.UNHEALTHY, RouteState.FAILED_TO_START)
# The agent's refusals that are about the node, not the route (nodes/agent/paths.py,
# nodes/agent/processes.py).
NODE_REFUSAL_CODES = frozenset({"path_not_allowed", "port_in_use"})
# Exactly what `process_name` makes: a slug, then "-r<revision>-<route id>" without leading zeros.
# The slug part is greedy, so a service named "a-r1-2" still parses ("a-r1-2-r3-4").
# A multi-node replica's workers add "-w<rank>".
PROCESS_NAME_RE = re.compile(
    r"(?P<service>[-a-zA-Z0-9_]+)-r(?P<revision>[1-9][0-9]*)-(?P<route>[1-9][0-9]*)"
    r"(?:-w(?P<rank>[1-9][0-9]*))?"
)


def backoff_s(restart_count: int) -> int:
    """Return how long a failed route waits before its replacement starts: 1, 2, 4 … 60 s."""
    return min(MAX_BACKOFF_S, 2 ** min(restart_count, 6))


def process_name(route: Route) -> str:
    """Return the name of a route's process on its node, e.g. "chat-r3-17"."""
    return f"{route.service.name}-r{route.revision.number}-{route.pk}"


def worker_rank(name: str) -> int:
    """Return the rank of a multi-node replica's worker process by its name; 0 for a main."""
    match = PROCESS_NAME_RE.fullmatch(name)
    return int(match["rank"]) if match and match["rank"] else 0


def names_route(name: str, route: Route) -> bool:
    """Say whether a process name is the route's own, or one of its workers'."""
    rank = worker_rank(name)
    return name == process_name(route) + (f"-w{rank}" if rank else "")


def route_id_of(name: str) -> int | None:
    """Return the route id in a replica process's name, or None when it is not a replica's."""
    match = PROCESS_NAME_RE.fullmatch(name)
    return int(match["route"]) if match else None


def orphan_reason(route: Route | None, name: str, node: Node, process_id: str) -> str:
    """Return why a running replica-named process on the node is an orphan; "" if it is not.

    `route` is the route whose id the name carries (None when there is none). A process is its
    route's while the route lives on this node with this process id, and also while the route
    is being started there (no process id yet: `start_route` adopts a process of its name) or
    ended but not yet stopped (the tick's `stop_ended` stops it).
    """
    if route is None or not names_route(name, route):
        return "its route does not exist"
    rank = worker_rank(name)
    if rank:
        return _worker_orphan_reason(route, rank, node, process_id)
    if route.state == RouteState.TERMINATED:
        return f"route {route.pk} is terminated"
    if route.state in ENDED:
        if route.ended_at is None:
            return ""
        return f"route {route.pk} has ended ({route.get_state_display().lower()})"
    if route.node_id != node.pk:
        where = f"node {route.node.name}" if route.node is not None else "no node"
        return f"route {route.pk} is placed on {where}"
    if route.process_id and route.process_id != process_id:
        return f"route {route.pk} runs process {route.process_id}"
    return ""


def _worker_orphan_reason(route: Route, rank: int, node: Node, process_id: str) -> str:
    """Return why a worker process of a multi-node replica is an orphan; "" if it is not."""
    if route.state == RouteState.TERMINATED:
        return f"route {route.pk} is terminated"
    if route.state in ENDED and route.ended_at is not None:
        return f"route {route.pk} has ended ({route.get_state_display().lower()})"
    part = route.parts.filter(rank=rank).first()
    if part is None:
        # Being started: the route's own process runs first, then its workers get their rows.
        starting = route.state == RouteState.PROVISIONING
        return "" if starting else f"route {route.pk} has no worker {rank}"
    if part.node_id != node.pk:
        return f"route {route.pk}'s worker {rank} is on another node"
    if part.process_id and part.process_id != process_id:
        return f"route {route.pk}'s worker {rank} runs process {part.process_id}"
    return ""


def record_error(route: Route, message: str) -> bool:
    """Add an error to the route while it stays in its state; say whether it was added."""
    error = {
        "at": timezone.now().isoformat(),
        "message": message,
        "exit_code": None,
        "log_tail": "",
    }
    return transition(route, [route.state], errors=[*route.errors, error][-MAX_ERRORS:])


def transition(route: Route, states: Iterable[str], **fields: Any) -> bool:
    """Update the route only while it is in one of `states`; say whether it was.

    The instance gets the new values when the update happened.
    """
    changed = Route.objects.filter(pk=route.pk, state__in=list(states)).update(
        **fields, updated_at=timezone.now()
    )
    if changed:
        for name, value in fields.items():
            setattr(route, name, value)
    return bool(changed)


# -- the process spec ----------------------------------------------------------------------


def map_mount(text: str, mount: str, real: str) -> str:
    """Return `text` with the mount destination replaced by the folder's path, if it is a path
    under it: exactly the mount, `<mount>/...`, or an option's `--flag=<mount>/...` value."""
    if text == mount or text.startswith(mount + "/"):
        return real + text[len(mount) :]
    key, equals, value = text.partition("=")
    if equals and (value == mount or value.startswith(mount + "/")):
        return key + equals + real + value[len(mount) :]
    return text


def _map_texts(value: Any, change: Callable[[list[str]], list[str]]) -> Any:
    """Apply `change` to every string in an action's arguments (nested lists and objects too)."""
    if isinstance(value, str):
        return change([value])[0]
    if isinstance(value, list):
        return [_map_texts(item, change) for item in value]
    if isinstance(value, dict):
        return {key: _map_texts(item, change) for key, item in value.items()}
    return value


def map_mounts(text: str, mounts: Sequence[tuple[str, str]]) -> str:
    """Return `text` mapped by the first of the (destination, real path) mounts it is under.

    One pass: a path already mapped to a real one is never mapped again by another mount
    whose destination happens to prefix it (the mounts themselves never overlap).
    """
    for mount, real in mounts:
        mapped = map_mount(text, mount, real)
        if mapped != text:
            return mapped
    return text


def _map_values(value: Any, mounts: Sequence[tuple[str, str]]) -> Any:
    """Map every string in an action's arguments (nested lists and objects too)."""
    if isinstance(value, str):
        return map_mounts(value, mounts)
    if isinstance(value, list):
        return [_map_values(item, mounts) for item in value]
    if isinstance(value, dict):
        return {key: _map_values(item, mounts) for key, item in value.items()}
    return value


def extra_mounts(revision: Revision) -> list[tuple[str, str]]:
    """Return the revision's extra mounts as (destination, the folder's real path); a folder
    deleted since is refused, as the model folder is."""
    found = []
    for mount in revision.spec.get("extra_mounts") or []:
        folder = ModelFolder.objects.filter(name=mount["folder"]).first()
        if folder is None:
            raise ModelFolder.DoesNotExist(f"the folder {mount['folder']!r} was deleted")
        found.append((mount["destination"], str(folder.path)))
    return found


def resource_need(revision: Revision) -> Need:
    """Return what one replica of the revision reserves on its node."""
    return Need.from_slots(revision.resource_slots or {}, port=revision.spec.get("port"))


def main_host(route: Route) -> str:
    """Return the address a multi-node replica's workers reach its main at: its node's host."""
    assert route.node is not None
    return urlsplit(route.node.address).hostname or "127.0.0.1"


def process_spec(
    route: Route,
    gpus: Sequence[int] = (),
    *,
    rank: int = 0,
    dist_port: int | None = None,
    folder_path: str | None = None,
) -> dict[str, Any]:
    """Return the agent's process spec (POST /agent/v1/processes) for a route.

    `rank` above 0 is a worker of a multi-node replica (the revision's worker command, with the
    main's rendezvous port `dist_port`); rank 0 is the route's own process, its main.
    """
    revision = route.revision
    spec = revision.spec
    mount = (revision.mount_destination or DEFAULT_MOUNT).rstrip("/") or "/"
    real = folder_path or str(revision.folder.path)
    # Extra folders are mounted from this machine's data dir, as the local agent sees it.
    mounts = [(mount, real), *extra_mounts(revision)]
    need = resource_need(revision)
    health_check = spec.get("health_check") or {}
    cluster = spec.get("cluster")
    argv = list(spec["argv"])
    actions = list(spec.get("pre_start_actions") or [])
    if cluster and rank > 0:
        argv = list(cluster["worker_argv"])
        actions = list(cluster.get("worker_pre_start_actions") or [])
    if cluster:
        fill = partial(
            fill_cluster_placeholders, main_host=main_host(route), rank=rank, dist_port=dist_port
        )
        argv = fill(argv)
        actions = [
            {**action, "args": _map_texts(action.get("args") or {}, fill)} for action in actions
        ]
    body: dict[str, Any] = {
        "argv": [map_mounts(item, mounts) for item in argv],
        "env": {key: map_mounts(value, mounts) for key, value in (spec.get("env") or {}).items()},
        "cwd": real,
        "name": process_name(route) + (f"-w{rank}" if rank else ""),
        # A process with a model is part of the node's inventory while it runs; a worker serves
        # nothing of its own.
        "model": None
        if rank
        else {
            "id": spec.get("model_name") or route.service.name,
            "runtime": revision.runtime_variant,
            "digest": None,
            "health_path": health_check.get("path"),
        },
        "resources": {
            "cpu_count": need.cpu,
            "memory_bytes": need.memory_bytes,
            "gpus": list(gpus),
        },
    }
    # Without a fixed port the agent allocates one for `${PORT}`; a fixed one is exclusive.
    if spec.get("port") is not None:
        body["port"] = spec["port"]
    if actions:
        body["pre_start_actions"] = [
            {**action, "args": _map_values(action.get("args") or {}, mounts)} for action in actions
        ]
    return body


# -- start, stop, observe ------------------------------------------------------------------


# A multi-node replica's worker: its node and the GPUs it reserves there.
Worker = tuple[Node, Sequence[int]]
# The job fields a route keeps of each node's copy of its model folder.
FOLDER_JOB_FIELDS = ("state", "bytes_done", "bytes_total", "percent", "error")


def place(
    route: Route,
    node: Node,
    gpus: Sequence[int],
    workers: Sequence[Worker],
    node_configs: Mapping[str, str] | None = None,
) -> bool:
    """Put a PROVISIONING route on its node (and its workers on theirs), then launch it.

    `node_configs` (each node's `node_config` when placed) lets a refusal name the
    configuration it was made under.
    """
    placement = {
        "gpus": list(gpus),
        "workers": [
            {"node": worker.name, "gpus": list(worker_gpus)} for worker, worker_gpus in workers
        ],
        "node_configs": dict(node_configs or {}),
    }
    if not transition(
        route, [RouteState.PROVISIONING], node=node, status_message="", placement=placement
    ):
        return False
    return launch(route)


def folder_pending(route: Route) -> bool:
    """Say whether the route waits for its model folder to be copied onto a node."""
    copies = (route.placement or {}).get("folders") or {}
    return any(copy.get("state") == "running" for copy in copies.values())


def launch(route: Route) -> bool:
    """Start a placed route once its model folder is on every node it spans; say whether it
    started. A node that lacks the folder copies it first (an agent job, followed each tick,
    its progress in the route's status); one that shares it, or copied it before, is at once.
    """
    node = route.node
    assert node is not None
    placement = dict(route.placement or {})
    workers = [
        (Node.objects.get(name=worker["node"]), tuple(worker.get("gpus") or ()))
        for worker in placement.get("workers") or ()
    ]
    revision = route.revision
    try:
        manifest = folder_manifest(revision)
    except FolderError as missing:
        fail(route, f"the model folder cannot be sent: {missing}")
        return False
    copies = dict(placement.get("folders") or {})
    paths: dict[str, str] = {}
    progress = []
    for target in [node, *(worker for worker, _ in workers)]:
        copy = dict(copies.get(target.name) or {})
        if copy.get("state") != "succeeded":
            try:
                with target.client() as agent:
                    if copy.get("job"):
                        job = agent.job(copy["job"])
                    else:
                        spec = folder_sync.job_spec(revision.folder, manifest, target.pk)
                        job = agent.submit_job(spec)
            except AgentUnreachable as error:
                message = f"waiting: node {target.name} did not answer: {error.reason}"
                transition(route, [RouteState.PROVISIONING], status_message=message)
                return False
            except AgentRefused as error:
                note_refusal(route, target.name, error)
                fail(route, f"node {target.name} refused the model folder: {error.message}")
                return False
            copy = {"job": job["id"], **{key: job.get(key) for key in FOLDER_JOB_FIELDS}}
            copy.update(job.get("result") or {})
            copies[target.name] = copy
        if copy["state"] == "failed":
            transition(route, [RouteState.PROVISIONING], placement={**placement, "folders": copies})
            folder = revision.model_folder_name
            fail(
                route,
                f"copying model folder {folder} to node {target.name} failed: {copy['error']}",
            )
            return False
        if copy["state"] == "succeeded":
            paths[target.name] = copy["path"]
        else:
            done = amount(copy.get("bytes_done") or 0, copy.get("bytes_total"))
            percent = f" ({copy['percent']:g}%)" if copy.get("percent") is not None else ""
            what = f"copying model folder {revision.model_folder_name} to node {target.name}"
            progress.append(f"{what}: {done}{percent}")
    waiting = "; ".join(progress)
    transition(
        route,
        [RouteState.PROVISIONING],
        placement={**placement, "folders": copies},
        status_message=waiting,
    )
    if waiting:
        return False
    return start_route(route, placement.get("gpus") or (), workers, paths)


def folder_manifest(revision: Revision) -> dict[str, Any]:
    """Return the revision's folder manifest, fixing it now if it has none yet."""
    if revision.folder_manifest is None:
        made = folder_sync.manifest(revision.folder)
        Revision.objects.filter(pk=revision.pk, folder_manifest__isnull=True).update(
            folder_manifest=made
        )
        revision.refresh_from_db(fields=["folder_manifest"])
    assert revision.folder_manifest is not None
    return revision.folder_manifest


def amount(done: int, total: int | None) -> str:
    """Return bytes copied in MiB: "12.0 of 48.0 MiB"."""
    if total is None:
        return f"{done / MIB:.1f} MiB"
    return f"{done / MIB:.1f} of {total / MIB:.1f} MiB"


def _start_or_adopt(node: Node, spec: dict[str, Any]) -> dict[str, Any]:
    """Return the running process of the spec's name on the node, starting it if there is none
    (an earlier start may have got through unanswered)."""
    with node.client() as agent:
        running = [
            record
            for record in agent.processes()
            if record.get("name") == spec["name"] and record.get("state") == "running"
        ]
        return running[0] if running else agent.start_process(spec)


def node_config(info: Mapping[str, Any]) -> str:
    """Return a digest of what decides whether an agent accepts a route: the directories it
    may use, its resources, and when it started (a changed configuration means a restart)."""
    facts = {key: info.get(key) for key in ("allowed_dirs", "resources", "started_at")}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def refused_for_the_node(error: AgentRefused) -> bool:
    """Say whether a refusal is the node's (a path it may not use, a resource it lacks or has
    taken) rather than the route's: another node may well accept the same route."""
    return error.code in NODE_REFUSAL_CODES or error.message.startswith("resources")


def note_refusal(route: Route, node_name: str, error: AgentRefused) -> None:
    """Keep on the route that a node refused it for the node's own reason, and under which of
    the node's configurations; the scheduler leaves that node out until it changes."""
    if not refused_for_the_node(error):
        return
    placement = dict(route.placement or {})
    placement["refused"] = {
        "node": node_name,
        "node_config": (placement.get("node_configs") or {}).get(node_name, ""),
        "message": error.message,
    }
    transition(route, [route.state], placement=placement)


def start_route(
    route: Route,
    gpus: Sequence[int] = (),
    workers: Sequence[Worker] = (),
    paths: Mapping[str, str] | None = None,
) -> bool:
    """Start a placed PROVISIONING route's process on its node; say whether it runs.

    A refusal fails the route (FAILED_TO_START, with the agent's reason); an agent that does not
    answer leaves it waiting, to be placed again. A running process of the route's name on the
    node is adopted rather than started twice, in case an earlier start got through unanswered.
    A multi-node replica's workers start once its main runs, each told the main's address.
    """
    node = route.node
    assert node is not None
    paths = paths or {}
    try:
        record = _start_or_adopt(node, process_spec(route, gpus, folder_path=paths.get(node.name)))
    except AgentUnreachable as error:
        transition(
            route,
            [RouteState.PROVISIONING],
            status_message=f"waiting: node {node.name} did not answer: {error.reason}",
        )
        return False
    except AgentRefused as error:
        note_refusal(route, node.name, error)
        fail(route, f"node {node.name} refused to start it: {error.message}")
        return False
    started = transition(
        route,
        [RouteState.PROVISIONING],
        process_id=str(record["id"]),
        port=record.get("port"),
        started_at=timezone.now(),
        status_message="",
    )
    if not started:
        # Retired while it was being started: its process must not outlive it.
        route.process_id = str(record["id"])
        stop_process(route)
        return False
    if workers and not _start_workers(route, workers, record.get("dist_port"), paths):
        stop_process(route)
        return False
    return True


def _start_workers(
    route: Route, workers: Sequence[Worker], dist_port: int | None, paths: Mapping[str, str]
) -> bool:
    """Start a multi-node replica's workers (ranks 1 …); fail the route if one cannot start."""
    for rank, (node, gpus) in enumerate(workers, start=1):
        part, _ = RoutePart.objects.get_or_create(route=route, rank=rank, defaults={"node": node})
        spec = process_spec(
            route, gpus, rank=rank, dist_port=dist_port, folder_path=paths.get(node.name)
        )
        try:
            record = _start_or_adopt(node, spec)
        except (AgentUnreachable, AgentRefused) as error:
            reason = error.reason if isinstance(error, AgentUnreachable) else error.message
            if isinstance(error, AgentRefused):
                note_refusal(route, node.name, error)
            fail(route, f"worker rank {rank} could not start on node {node.name}: {reason}")
            return False
        RoutePart.objects.filter(pk=part.pk).update(
            node=node, process_id=str(record["id"]), started_at=timezone.now()
        )
    return True


def part_ended(route: Route, records_by_node: Mapping[int, Mapping[str, Any] | None]) -> str:
    """Return how a worker of the route ended ("" while all run or cannot be seen).

    `records_by_node` holds each node's processes by id (None: its agent did not answer).
    """
    # Every ended part is named: the first to end takes the others with it, and the one that
    # ended first cannot be told from here.
    ended = []
    for part in route.parts.select_related("node").order_by("rank"):
        records = records_by_node.get(part.node_id)
        if records is None or not part.process_id:
            continue
        record = records.get(part.process_id)
        where = f"worker rank {part.rank} on node {part.node.name}"
        if record is None:
            ended.append(f"{where} is gone")
        elif record.get("state") != "running":
            ended.append(f"{where}: {ended_message(record)}")
    return "; ".join(ended)


def fail(
    route: Route,
    message: str,
    *,
    exit_code: int | None = None,
    log_tail: str = "",
) -> bool:
    """End a route: FAILED_TO_START while provisioning, UNHEALTHY once it was healthy.

    The error is kept on the route and its replacement waits out the backoff.
    """
    now = timezone.now()
    endings: dict[str, RouteState] = {
        RouteState.PROVISIONING: RouteState.FAILED_TO_START,
        RouteState.HEALTHY: RouteState.UNHEALTHY,
    }
    ended = endings.get(route.state)
    if ended is None:
        return False
    error = {
        "at": now.isoformat(),
        "message": message,
        "exit_code": exit_code,
        "log_tail": log_tail,
    }
    return transition(
        route,
        [route.state],
        state=ended,
        errors=[*route.errors, error][-MAX_ERRORS:],
        status_message=message,
        not_before=now + timedelta(seconds=backoff_s(route.restart_count)),
        # Its process is gone (it exited, or never started); a multi-node replica's other parts
        # may still run, so the tick's stop_ended stops them all first.
        ended_at=None if route.parts.exists() else now,
    )


def node_processes(node: Node) -> dict[str, dict[str, Any]] | None:
    """Return the node's processes by id, or None when its agent does not answer."""
    try:
        with node.client() as agent:
            return {str(record["id"]): record for record in agent.processes()}
    except (AgentUnreachable, AgentRefused) as error:
        logger.info("cannot read the processes of node %s: %s", node.name, error)
        return None


def notice_exit(route: Route, record: Mapping[str, Any] | None) -> bool:
    """Fail a PROVISIONING or HEALTHY route whose process has ended; say whether it had.

    `record` is the agent's process record, or None when the agent no longer knows it.
    """
    if record is not None and record.get("state") == "running":
        return False
    if record is None:
        assert route.node is not None
        return fail(route, f"node {route.node.name} no longer knows process {route.process_id}")
    return fail(
        route,
        ended_message(record),
        exit_code=record.get("exit_code"),
        log_tail=str(record.get("log_tail") or ""),
    )


def ended_message(record: Mapping[str, Any]) -> str:
    """Return how a process ended, in words."""
    exit_code = record.get("exit_code")
    if record.get("state") == "lost":
        return f"the process was lost: {record.get('message') or 'it ended unseen'}"
    if exit_code is None:
        return f"the process ended ({record.get('message') or 'exit code unknown'})"
    if exit_code < 0:
        return f"the process was killed by signal {-exit_code}"
    return f"the process exited with code {exit_code}"


def stop_process(route: Route, grace_s: float = STOP_GRACE_S) -> bool:
    """Stop the route's process and its workers' (SIGTERM, SIGKILL after `grace_s`); say
    whether they are all gone.

    A node that cannot be reached and is no longer usable (offline, untrusted) counts as gone:
    nothing more can be done from here, and its status says why.
    """
    gone = True
    notes = []
    parts = [(route.node, route.process_id)]
    parts += [(part.node, part.process_id) for part in route.parts.select_related("node")]
    for node, process_id in parts:
        if node is None or not process_id:
            continue
        stopped, note = _stop(node, process_id, grace_s)
        gone = gone and stopped
        if note:
            notes.append(note)
    if notes:
        route.status_message = "; ".join(notes)
    if not gone:
        Route.objects.filter(pk=route.pk).update(status_message=route.status_message)
    return gone


def _stop(node: Node, process_id: str, grace_s: float) -> tuple[bool, str]:
    """Stop one process; return whether it is gone and, if something is left unsaid, why."""
    try:
        with node.client() as agent:
            agent.stop_process(process_id, grace_s=grace_s)
    except AgentRefused as error:
        if error.status == 404:
            return True, ""
        return False, f"cannot stop its process on node {node.name}: {error.message}"
    except AgentUnreachable as error:
        node.refresh_from_db(fields=["trust", "status"])
        if not node.is_usable:
            return True, f"{node.unusable_reason()}; its process was not stopped"
        return False, f"cannot stop its process: node {node.name}: {error.reason}"
    return True, ""


def stop_route(route: Route, grace_s: float = STOP_GRACE_S) -> bool:
    """Stop a TERMINATING route's process and mark it TERMINATED; say whether it is."""
    if not stop_process(route, grace_s):
        return False
    return transition(
        route,
        [RouteState.TERMINATING],
        state=RouteState.TERMINATED,
        ended_at=route.ended_at or timezone.now(),
        status_message=route.status_message,
    )


def clear_errors_and_retry(route: Route) -> Route:
    """Forget the route's errors and restarts; a failed route is replaced at the next tick."""
    fields: dict[str, Any] = {"errors": [], "restart_count": 0}
    if route.state in ENDED:
        fields["not_before"] = timezone.now()
    Route.objects.filter(pk=route.pk).update(**fields, updated_at=timezone.now())
    for name, value in fields.items():
        setattr(route, name, value)
    return route


# Lines of a replica's output the route drawer shows.
LOG_TAIL_LINES = 100


def log_tail(route: Route) -> str:
    """Return the last lines of the route's process output, or why there are none: read from
    its node's agent while it runs, else the tail kept with its latest error."""
    if route.node is not None and route.process_id:
        try:
            with route.node.client() as agent:
                return agent.process_log(route.process_id, tail=LOG_TAIL_LINES)
        except (AgentUnreachable, AgentRefused) as error:
            kept = route.errors[-1].get("log_tail", "") if route.errors else ""
            return kept or f"(the log cannot be read now: {error})"
    kept = route.errors[-1].get("log_tail", "") if route.errors else ""
    return kept or "(no process yet)"
