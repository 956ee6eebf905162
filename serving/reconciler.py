"""The serving reconciler: one tick makes each service's replicas what the service wants.

Per tick and service (`serving.tasks.reconcile`, every NEXUS_SERVING_TICK_S), in order:

1. notice processes that exited (FAILED_TO_START while provisioning, UNHEALTHY once healthy);
2. stop drained routes, and the processes of ended routes;
3. either keep the latest revision at the desired count (replace ended routes after their
   backoff, add or retire routes), or roll it out replica by replica, or roll it back;
4. place and start the routes that have no node yet;
5. bring the managed pool in step and say how the service stands.

A service being destroyed has every route drained and stopped, then its pool dropped and its
tokens revoked. Ticks are idempotent; a per-service Redis lock keeps two ticks (two beats, two
workers) off one service, and a placement lock keeps two services from filling one node at once.
Routes leave traffic before they stop: their target drains (no new requests) until the gateway
saw the last in-flight one finish, or DRAIN_GRACE_S passed.

After the services, each usable node is swept for orphan replica processes (at most once per
SWEEP_INTERVAL_S per node, over every worker): processes named like a replica whose route is gone,
has ended, or lives elsewhere. A start whose answer was lost, or a stop that found the node offline,
leaves such processes behind.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from redis.exceptions import LockError, RedisError

from nexus.services import redis_client
from nodes import services as node_services
from nodes.client import AgentRefused, AgentUnreachable
from nodes.models import Node
from pools import services as pool_services
from serving import live, replicas
from serving.models import (
    Revision,
    RevisionState,
    Route,
    RoutePart,
    RouteState,
    Service,
    ServiceLifecycle,
    readiness_text,
)
from serving.pool_sync import drop_service_pool, sync_service_pool
from serving.scheduler import Candidate, schedule
from serving.tokens import revoke_service_tokens

logger = logging.getLogger(__name__)

# How long a retired replica's target drains before its process is stopped regardless: the
# gateway marks it drained sooner once its last in-flight request is done.
DRAIN_GRACE_S = 30.0
# A rollout's new replica must be HEALTHY this long after its health check could first have
# made it so; a revision without a health check gets a flat deadline.
ROLLOUT_SLACK_S = 30.0
NO_HEALTH_CHECK_DEADLINE_S = 120.0
# Longer than any tick (stops wait for their grace); a crashed worker's lock expires by then.
LOCK_TIMEOUT_S = 300
PLACEMENT_LOCK_WAIT_S = 30.0
INSUFFICIENT = "waiting: insufficient resources in "
# How many of a revision's ended routes are read for node refusals (a restart loop makes many).
REFUSALS_LOOKED_AT = 50
# A node is swept for orphans at most this often (a Redis key with this TTL claims the sweep).
SWEEP_INTERVAL_S = 30
# An orphan serves nobody: it gets a short SIGTERM grace, also so that a sweep stays short.
SWEEP_GRACE_S = 3.0

LIVE = (RouteState.PROVISIONING, RouteState.HEALTHY)
WATCHED = (RouteState.PROVISIONING, RouteState.HEALTHY, RouteState.TERMINATING)
UNFINISHED_REVISIONS = (RevisionState.PENDING, RevisionState.ROLLING_OUT, RevisionState.RUNNING)


def reconcile_all() -> dict[str, int]:
    """Run one tick for every active or destroying service; return how many ended how."""
    summary: Counter[str] = Counter()
    alive = Service.objects.exclude(lifecycle=ServiceLifecycle.DESTROYED).order_by("pk")
    for service in alive:
        try:
            summary[reconcile(service)] += 1
        except Exception:
            # One broken service must not keep the others from being reconciled.
            logger.exception("reconciling service %s failed", service.name)
            summary["failed"] += 1
    try:
        stopped = sweep_orphans()
    except Exception:
        logger.exception("sweeping orphan replica processes failed")
        stopped = 0
    if stopped:
        summary["orphans_stopped"] += stopped
    return dict(summary)


def sweep_orphans() -> int:
    """Sweep the usable nodes that are due; return how many orphan processes were stopped."""
    stopped = 0
    for node in node_services.usable_nodes().order_by("pk"):
        key = f"{settings.NEXUS_REDIS_PREFIX}:serving:sweep:{node.pk}"
        try:
            # SET NX EX: one worker claims the node's sweep; the TTL spaces the sweeps.
            claimed = redis_client().set(key, "1", nx=True, ex=SWEEP_INTERVAL_S)
        except RedisError as error:
            logger.warning("not sweeping node %s: no claim without Redis: %s", node.name, error)
            return stopped
        if claimed:
            stopped += sweep_node(node)
    return stopped


def sweep_node(node: Node) -> int:
    """Stop the node's running replica processes that are no route's; return how many.

    Only names `replicas.process_name` makes are considered: any other process (a deployment's
    runtime, an operator's) is never touched.
    """
    try:
        with node.client() as agent:
            records = agent.processes()
    except (AgentUnreachable, AgentRefused) as error:
        logger.info("not sweeping node %s: %s", node.name, error)
        return 0
    # The agent is read before the routes: a listed process was started before they are read,
    # so its route already names this node (kept while it has no process id) or its id.
    found: list[tuple[str, str, int]] = []
    for record in records:
        name = str(record.get("name") or "")
        route_id = replicas.route_id_of(name)
        if route_id is not None and record.get("state") == "running":
            found.append((str(record["id"]), name, route_id))
    if not found:
        return 0
    routes = Route.objects.select_related("service", "revision", "node").in_bulk(
        [route_id for _, _, route_id in found]
    )
    stopped = 0
    for process_id, name, route_id in found:
        route = routes.get(route_id)
        reason = replicas.orphan_reason(route, name, node, process_id)
        if reason and _stop_orphan(node, process_id, name, reason):
            stopped += 1
            if route is not None and replicas.names_route(name, route):
                message = f"orphan process {process_id} stopped on node {node.name}: {reason}"
                replicas.record_error(route, message)
    return stopped


def _stop_orphan(node: Node, process_id: str, name: str, reason: str) -> bool:
    """Stop one orphan process; say whether this call stopped it."""
    try:
        with node.client() as agent:
            agent.stop_process(process_id, grace_s=SWEEP_GRACE_S)
    except (AgentUnreachable, AgentRefused) as error:
        # A 404: it ended meanwhile. Anything else: the next sweep tries again.
        logger.info("node %s: orphan %s (%s) not stopped: %s", node.name, name, process_id, error)
        return False
    logger.warning("node %s: stopped orphan %s (%s): %s", node.name, name, process_id, reason)
    return True


def reconcile(service: Service) -> str:
    """Run one tick for the service; return "ok", "busy" (another tick holds it) or its end."""
    lock = redis_client().lock(
        f"{settings.NEXUS_REDIS_PREFIX}:serving:reconcile:{service.pk}", timeout=LOCK_TIMEOUT_S
    )
    try:
        if not lock.acquire(blocking=False):
            return "busy"
    except RedisError as error:
        logger.warning("not reconciling %s: no lock without Redis: %s", service.name, error)
        return "busy"
    try:
        fresh = Service.objects.select_related(
            "latest_revision", "running_revision", "pool"
        ).filter(pk=service.pk)
        current = fresh.first()
        return _Tick(current).run() if current is not None else "gone"
    finally:
        with suppress(LockError, RedisError):
            lock.release()
        # Open pages show what the tick made of it (a row is pushed only when it changed).
        live.after_tick(service.pk)


def rollout_deadline_s(revision: Revision) -> float:
    """Return how long a rollout waits for a new route to become HEALTHY before rolling back."""
    check = revision.spec.get("health_check")
    if not check:
        return NO_HEALTH_CHECK_DEADLINE_S
    delay = float(check.get("initial_delay", 60.0))
    interval = float(check.get("interval", 10.0))
    retries = int(check.get("max_retries", 10))
    return delay + interval * (retries + 1) + ROLLOUT_SLACK_S


def failure_reason(route: Route) -> str:
    """Return why a new route failed, e.g. "route 14 failed to start: exit code 1: <line>"."""
    what = "failed to start" if route.state == RouteState.FAILED_TO_START else "became unhealthy"
    error = route.errors[-1] if route.errors else {}
    if error.get("exit_code") is not None:
        detail = f"exit code {error['exit_code']}"
        lines = str(error.get("log_tail") or "").strip().splitlines()
        if lines:
            detail += f": {lines[-1].strip()}"
    else:
        detail = error.get("message") or route.status_message or "no reason given"
    return f"route {route.pk} {what}: {detail}"


@contextmanager
def _placement_lock() -> Iterator[bool]:
    """Hold the fleet-wide placement lock (yield False when it could not be had in time)."""
    lock = redis_client().lock(
        f"{settings.NEXUS_REDIS_PREFIX}:serving:placement",
        timeout=LOCK_TIMEOUT_S,
        blocking_timeout=PLACEMENT_LOCK_WAIT_S,
    )
    try:
        held = lock.acquire()
    except RedisError:
        held = False
    try:
        yield held
    finally:
        if held:
            with suppress(LockError, RedisError):
                lock.release()


class _Tick:
    """One reconciliation of one service; the routes are re-read after every step."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.now = timezone.now()
        self.pool_problem = ""

    def routes(self) -> list[Route]:
        """Return the service's routes that have not ended for good, oldest first."""
        routes = list(
            self.service.routes.exclude(state=RouteState.TERMINATED)
            .select_related("node", "revision__model_folder", "revision__resource_group")
            .order_by("pk")
        )
        for route in routes:
            route.service = self.service
        return routes

    def run(self) -> str:
        if self.service.lifecycle == ServiceLifecycle.DESTROYED:
            return "destroyed"
        self.observe()
        if self.service.lifecycle == ServiceLifecycle.DESTROYING:
            return self.destroy()
        # Routes that just became HEALTHY get their targets before any old one is drained.
        self.sync()
        self.finish_drains()
        self.stop_ended()
        if self.service.running_revision is None:
            self.adopt_running()
        latest, running = self.service.latest_revision, self.service.running_revision
        self.supersede_replaced(latest, running)
        if latest is None:
            for route in self.routes():
                self.retire(route)
        elif running is not None and running.pk != latest.pk:
            self.roll_out(latest, running)
        else:
            self.keep(latest)
        self.place_and_start()
        self.sync()
        self.report()
        return "ok"

    # -- noticing what happened ----------------------------------------------------------

    def observe(self) -> None:
        """Read each node's processes once; settle the routes whose process has ended.

        A multi-node replica whose worker has ended fails as a whole, like one whose main has.
        """
        by_node: dict[int, list[Route]] = defaultdict(list)
        nodes: dict[int, Node] = {}
        for route in self.routes():
            watched = route.state in WATCHED or route.ended_at is None
            if route.node is not None and route.process_id and watched:
                by_node[route.node.pk].append(route)
                nodes[route.node.pk] = route.node
        clustered = [r for rs in by_node.values() for r in rs if r.revision.spec.get("cluster")]
        for part in RoutePart.objects.filter(route__in=clustered).select_related("node"):
            nodes.setdefault(part.node_id, part.node)
        seen = {node_id: replicas.node_processes(node) for node_id, node in nodes.items()}
        for route in clustered:
            if route.state in LIVE and (ended := replicas.part_ended(route, seen)):
                # Its main and the other workers may still run: stop_ended stops them.
                replicas.fail(route, ended)
        for node_id, routes in by_node.items():
            records = seen[node_id]
            if records is None:
                continue  # not answering: nothing learnt; probes take its routes out of traffic
            for route in routes:
                record = records.get(route.process_id)
                running = record is not None and record.get("state") == "running"
                if route.state in LIVE:
                    replicas.notice_exit(route, record)
                elif not running and route.state == RouteState.TERMINATING:
                    replicas.transition(
                        route, [route.state], state=RouteState.TERMINATED, ended_at=self.now
                    )
                elif not running:
                    replicas.transition(route, [route.state], ended_at=self.now)

    def finish_drains(self) -> None:
        """Stop the retired routes whose targets have drained (or never had one)."""
        for route in self.routes():
            if route.state != RouteState.TERMINATING:
                continue
            if route.target_id is None or pool_services.drain_finished(
                route.target_id, DRAIN_GRACE_S
            ):
                replicas.stop_route(route)

    def stop_ended(self) -> None:
        """Stop the processes of ended routes (health probes end routes whose process runs)."""
        for route in self.routes():
            if route.state not in replicas.ENDED:
                continue
            fields: dict[str, Any] = {}
            if route.not_before is None:
                backoff = replicas.backoff_s(route.restart_count)
                fields["not_before"] = self.now + timedelta(seconds=backoff)
            if route.ended_at is None and replicas.stop_process(route):
                fields["ended_at"] = self.now
            if fields:
                replicas.transition(route, [route.state], **fields)

    # -- deciding which routes there should be -------------------------------------------

    def keep(self, revision: Revision) -> None:
        """Keep the desired count of routes of this revision; retire every other route.

        Also the first rollout of a service (nothing serves yet): its routes all start at once,
        and failed ones are replaced with backoff, as there is nothing to roll back to.
        """
        if revision.state == RevisionState.PENDING:
            self.set_revision_state(revision, RevisionState.ROLLING_OUT)
        routes = self.routes()
        for route in routes:
            if route.revision_id != revision.pk and route.state != RouteState.TERMINATING:
                self.retire(route)
        mine = [route for route in routes if route.revision_id == revision.pk]
        live = [route for route in mine if route.state in LIVE]
        waiting = [route for route in mine if route.state in replicas.ENDED]
        missing = self.service.desired_replicas - len(live) - len(waiting)
        if missing < 0:
            for route in _retire_order(waiting + live)[:-missing]:
                self.retire(route)
            return
        for route in waiting:
            due = route.not_before is not None and route.not_before <= self.now
            if due and route.ended_at is not None:
                self.replace(route)
        for _ in range(missing):
            self.add(revision)
        if self.service.running_revision is None and self.service.desired_replicas == 0:
            self.finish_rollout(revision)  # nothing to wait for

    def adopt_running(self) -> None:
        """Make the revision with a ready replica the running one, if none runs yet.

        So the first rollout is done once a replica serves, and a revision made before then
        rolls out over the serving replicas instead of replacing them all at once.
        """
        serving = [route.revision for route in self.routes() if route.state == RouteState.HEALTHY]
        if not serving:
            return
        revision = max(serving, key=lambda revision: revision.number)
        adopted = Service.objects.filter(pk=self.service.pk, running_revision=None).update(
            running_revision=revision, updated_at=timezone.now()
        )
        if adopted:
            self.set_revision_state(revision, RevisionState.RUNNING)
            self.service.refresh_from_db()

    def roll_out(self, latest: Revision, running: Revision) -> None:
        """Replace the running revision's routes by the latest's, one at a time (surge 1).

        A new route is started only while no other is provisioning or draining; an old one is
        drained once a new one serves. A new route that fails, or is not HEALTHY in time,
        rolls the revision back.
        """
        routes = self.routes()
        new = [route for route in routes if route.revision_id == latest.pk]
        failed = [route for route in new if route.state in replicas.ENDED]
        if failed:
            self.roll_back(latest, running, failure_reason(failed[0]))
            return
        deadline_s = rollout_deadline_s(latest)
        for route in new:
            waited_s = (self.now - route.created_at).total_seconds()
            if route.state == RouteState.PROVISIONING and waited_s > deadline_s:
                reason = f"route {route.pk} was not healthy within {deadline_s:g} s"
                if route.status_message:
                    reason += f" ({route.status_message})"
                self.roll_back(latest, running, reason)
                return
        if latest.state == RevisionState.PENDING:
            self.set_revision_state(latest, RevisionState.ROLLING_OUT)
        for route in routes:
            if route.revision_id != latest.pk and route.state in replicas.ENDED:
                self.retire(route)  # not replaced: the latest takes its place
        old = [r for r in routes if r.revision_id != latest.pk and r.state in LIVE]
        serving = [r for r in new if r.state == RouteState.HEALTHY and r.target_id is not None]
        starting = [r for r in new if r.state in LIVE and r not in serving]
        draining = any(route.state == RouteState.TERMINATING for route in routes)
        desired = self.service.desired_replicas
        if not old and len(serving) >= desired:
            self.finish_rollout(latest)
        elif serving and len(old) + len(serving) > desired:
            # Replicas of a revision that never ran go first, then those not serving, then the
            # newest.
            order = sorted(
                old,
                key=lambda r: (r.revision_id == running.pk, r.state == RouteState.HEALTHY, -r.pk),
            )
            self.retire(order[0])
        elif len(serving) + len(starting) < desired and not starting and not draining:
            self.add(latest)

    def roll_back(self, latest: Revision, running: Revision, reason: str) -> None:
        """Give up the latest revision: stop its routes, keep the running ones serving."""
        for route in self.routes():
            if route.revision_id == latest.pk and route.state != RouteState.TERMINATING:
                self.retire(route)
        Revision.objects.filter(pk=latest.pk, state__in=UNFINISHED_REVISIONS).update(
            state=RevisionState.ROLLED_BACK, failure_reason=reason
        )
        # Conditional: a revision made meanwhile is the next rollout, not to be undone.
        Service.objects.filter(pk=self.service.pk, latest_revision=latest).update(
            latest_revision=running, updated_at=timezone.now()
        )
        self.service.refresh_from_db()
        logger.warning("service %s: r%s rolled back: %s", self.service.name, latest.number, reason)

    def finish_rollout(self, revision: Revision) -> None:
        """Make the revision the running one; every earlier unfinished one is superseded."""
        switched = Service.objects.filter(pk=self.service.pk, latest_revision=revision).update(
            running_revision=revision, updated_at=timezone.now()
        )
        if not switched:
            return
        self.set_revision_state(revision, RevisionState.RUNNING)
        self.service.revisions.filter(state__in=UNFINISHED_REVISIONS).exclude(
            pk=revision.pk
        ).update(state=RevisionState.SUPERSEDED)
        self.service.refresh_from_db()

    def supersede_replaced(self, latest: Revision | None, running: Revision | None) -> None:
        """Mark superseded the unfinished revisions a later one replaced before they ran.

        Only the latest and the running revision are ever rolled out or kept; an earlier one
        still pending or rolling out never will be (its routes are retired with the others).
        Only earlier ones: a revision made since this tick read the service is the next rollout.
        """
        if latest is None:
            return
        replaced = self.service.revisions.filter(
            state__in=UNFINISHED_REVISIONS, number__lt=latest.number
        )
        if running is not None:
            replaced = replaced.exclude(pk=running.pk)
        replaced.update(state=RevisionState.SUPERSEDED)

    def set_revision_state(self, revision: Revision, state: str) -> None:
        Revision.objects.filter(pk=revision.pk, state__in=UNFINISHED_REVISIONS).update(state=state)
        revision.state = state

    # -- changing routes -----------------------------------------------------------------

    def add(self, revision: Revision) -> Route:
        return Route.objects.create(service=self.service, revision=revision)

    def replace(self, route: Route) -> None:
        """Start a new route in place of an ended one; it carries the errors and restarts."""
        with transaction.atomic():
            new = Route.objects.create(
                service=self.service,
                revision=route.revision,
                restart_count=route.restart_count + 1,
                errors=route.errors,
                status_message=f"replaces route {route.pk}",
            )
            replaced = replicas.transition(
                route,
                [route.state],
                state=RouteState.TERMINATED,
                status_message=f"replaced by route {new.pk}",
            )
            if not replaced:
                transaction.set_rollback(True)

    def retire(self, route: Route) -> None:
        """Take the route out: drain a serving one, stop the others now."""
        if route.state == RouteState.HEALTHY and route.target_id is not None:
            replicas.transition(
                route, [route.state], state=RouteState.TERMINATING, status_message="draining"
            )
        elif route.state in LIVE:
            if replicas.transition(route, [route.state], state=RouteState.TERMINATING):
                replicas.stop_route(route)
        elif route.state in replicas.ENDED and (
            route.ended_at is not None or replicas.stop_process(route)
        ):
            replicas.transition(
                route,
                [route.state],
                state=RouteState.TERMINATED,
                ended_at=route.ended_at or self.now,
            )

    # -- placing -------------------------------------------------------------------------

    def place_and_start(self) -> None:
        """Choose nodes for the routes that have none and start them there."""
        waiting: dict[int, list[Route]] = defaultdict(list)
        for route in self.routes():
            if route.state != RouteState.PROVISIONING or route.process_id:
                continue
            if route.node is not None and replicas.folder_pending(route):
                # Its model folder is being copied onto a node: follow it, start when there.
                replicas.launch(route)
                continue
            if route.node is not None:
                # Placed but never started (its agent did not answer): choose again.
                replicas.transition(route, [route.state], node=None)
            waiting[route.revision_id].append(route)
        if not waiting:
            return
        with _placement_lock() as held:
            if not held:
                return  # another service is placing; the next tick tries again
            for routes in waiting.values():
                self.place(routes)

    def place(self, routes: Sequence[Route]) -> None:
        """Place routes of one revision on its group's usable nodes, spreading them."""
        revision = routes[0].revision
        group = revision.resource_group
        nodes = node_services.usable_nodes()
        if not group.all_nodes:
            nodes = nodes.filter(pk__in=group.nodes.values("pk"))
        by_name = {node.name: node for node in nodes}
        candidates, configs = self.candidates(list(by_name.values()), revision)
        size = int((revision.spec.get("cluster") or {}).get("size") or 1)
        need = replicas.resource_need(revision)
        decision = schedule(len(routes), candidates, need, group.name, size=size)
        for route, placement in zip(routes, decision.placements, strict=False):
            node = by_name[placement.node]
            workers = [(by_name[worker.node], worker.gpus) for worker in placement.workers]
            placed_on = [node.name, *(worker.name for worker, _ in workers)]
            used = {name: configs[name] for name in placed_on}
            replicas.place(route, node, placement.gpus, workers, used)
        for route in routes[len(decision.placements) :]:
            replicas.transition(
                route, [RouteState.PROVISIONING], status_message=f"waiting: {decision.reason}"
            )

    def candidates(
        self, nodes: Sequence[Node], revision: Revision
    ) -> tuple[list[Candidate], dict[str, str]]:
        """Return the nodes as the scheduler sees them, free slots read from their agents now,
        with each node's configuration digest (`replicas.node_config`) by name.

        A node that refused a route of this revision for its own reason (a path it may not
        use, a resource) under the configuration it has now is marked refused.
        """
        refusals = _refusals(revision)
        on_nodes = Route.objects.exclude(state=RouteState.TERMINATED).filter(node__in=nodes)
        counts = Counter(on_nodes.filter(service=self.service).values_list("node_id", flat=True))
        ports: dict[int, set[int]] = defaultdict(set)
        for node_id, port in on_nodes.values_list("node_id", "port"):
            if port is not None:
                ports[node_id].add(port)
        found = []
        configs = {}
        for node in nodes:
            try:
                with node.client() as agent:
                    info = agent.info()
            except (AgentUnreachable, AgentRefused) as error:
                logger.info("not placing on node %s: %s", node.name, error)
                continue
            configs[node.name] = replicas.node_config(info)
            config, refused = refusals.get(node.name, ("", ""))
            found.append(
                Candidate(
                    node.name,
                    info.get("free") or {},
                    counts[node.pk],
                    frozenset(ports[node.pk]),
                    refused=refused if config == configs[node.name] else "",
                )
            )
        return found, configs

    # -- the pool, destroying, the status ------------------------------------------------

    def sync(self) -> None:
        try:
            sync_service_pool(self.service)
        except pool_services.PoolConflict as conflict:
            self.pool_problem = f"cannot serve: {conflict}"

    def destroy(self) -> str:
        """Drain and stop every route; then drop the pool, revoke the tokens, mark destroyed."""
        for route in self.routes():
            if route.state != RouteState.TERMINATING:
                self.retire(route)
        self.sync()
        self.finish_drains()
        left = self.routes()
        if left:
            message = f"destroying: {len(left)} replica{'s' if len(left) != 1 else ''} stopping"
            Service.objects.filter(pk=self.service.pk).update(status_message=message)
            return "destroying"
        drop_service_pool(self.service)
        # A later service may take the name; it must not inherit this one's callers.
        revoke_service_tokens(self.service)
        Service.objects.filter(pk=self.service.pk, lifecycle=ServiceLifecycle.DESTROYING).update(
            lifecycle=ServiceLifecycle.DESTROYED,
            destroyed_at=self.now,
            status_message="destroyed",
            updated_at=self.now,
        )
        logger.info("service %s destroyed", self.service.name)
        return "destroyed"

    def report(self) -> None:
        """Say how the service stands: "1 of 2 replicas ready · rolling out r3"."""
        routes = self.routes()
        desired = self.service.desired_replicas
        ready = sum(route.state == RouteState.HEALTHY for route in routes)
        parts = [readiness_text(ready, desired)]
        latest, running = self.service.latest_revision, self.service.running_revision
        if latest is not None and (running is None or running.pk != latest.pk):
            parts.append(f"rolling out r{latest.number}")
        for route in routes:
            if route.state == RouteState.PROVISIONING and route.status_message.startswith(
                INSUFFICIENT
            ):
                group = route.status_message.removeprefix(INSUFFICIENT).split(":")[0]
                parts.append(f"{INSUFFICIENT}{group}")
                break
        if self.pool_problem:
            parts.append(self.pool_problem)
        message = " · ".join(parts)
        if message != self.service.status_message:
            Service.objects.filter(pk=self.service.pk).update(status_message=message)
            self.service.status_message = message


def _refusals(revision: Revision) -> dict[str, tuple[str, str]]:
    """Return the latest node refusal of the revision's recent routes by node name: the node's
    configuration digest then, and what it refused."""
    found: dict[str, tuple[str, str]] = {}
    recent = (
        Route.objects.filter(revision=revision, state__in=(*replicas.ENDED, RouteState.TERMINATED))
        .order_by("-pk")
        .values_list("pk", "placement")[:REFUSALS_LOOKED_AT]
    )
    for pk, placement in recent:
        refused = (placement or {}).get("refused")
        if refused:
            message = f"refused route {pk}: {refused['message']}"
            found.setdefault(refused["node"], (refused["node_config"], message))
    return found


def _retire_order(routes: Sequence[Route]) -> list[Route]:
    """Return routes in the order they go when scaling down: ended, starting, serving; newest
    first within each."""
    rank: dict[str, int] = {
        RouteState.UNHEALTHY: 0,
        RouteState.FAILED_TO_START: 0,
        RouteState.PROVISIONING: 1,
    }
    return sorted(routes, key=lambda route: (rank.get(route.state, 2), -route.pk))
