"""Every state badge the console shows: its words, its tone, its shape and why it is so.

Pure Python, no Django: one builder per kind of thing takes the stored values (plain strings,
numbers, datetimes) and returns a `Badge`; `{% badge %}` (nexus/templatetags/ui.py) renders it
as one `<span class="badge">`. A row shows `worst(...)` of the badges that apply, so a page
never says "Healthy" for something drained, ejected or offline.

Tones (UI.md): green ok, amber transitional or warning, red failed, grey inactive, blue
information. Colour is never the only signal: every badge has its words and an icon whose shape
differs by meaning (✓ ok, ◐ under way, ! warning, ✕ failed, ○ inactive, ⊘ turned off, i info).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from nexus.ui import format


class Tone(StrEnum):
    """A badge's meaning, which its colour and icon show."""

    OK = "ok"
    INFO = "info"
    OFF = "off"
    WARN = "warn"
    BAD = "bad"


# Which badge a row shows when several apply: the higher, the more an operator must know it.
SEVERITY = {Tone.OK: 0, Tone.INFO: 1, Tone.OFF: 2, Tone.WARN: 3, Tone.BAD: 4}

OK, UNDER_WAY, WARNING, FAILED, INACTIVE, TURNED_OFF, INFO = "✓", "◐", "!", "✕", "○", "⊘", "i"


@dataclass(frozen=True)
class Badge:
    """One state as a page shows it: "Draining (3 in flight)", amber, with why in its title."""

    kind: str
    state: str  # the machine value, for data-state and tests
    label: str
    tone: Tone
    icon: str
    detail: str = ""  # shown in brackets after the label
    reason: str = ""  # the title: why it is so, in a sentence

    @property
    def text(self) -> str:
        return f"{self.label} ({self.detail})" if self.detail else self.label

    @property
    def severity(self) -> int:
        return SEVERITY[self.tone]


@dataclass(frozen=True)
class State:
    """What a state looks like before a builder adds the detail and the reason."""

    label: str
    tone: Tone
    icon: str
    reason: str = ""


def worst(*badges: Badge | None) -> Badge:
    """Return the badge a row shows: the most severe; the first of equals."""
    present = [badge for badge in badges if badge is not None]
    if not present:
        raise ValueError("worst() needs at least one badge")
    return max(present, key=lambda badge: badge.severity)


def _joined(*parts: str) -> str:
    return ", ".join(part for part in parts if part)


# Kinds: each maps the stored values to states, and a builder adds the detail and reason.

TARGET_STATES = {
    "active": State("Active", Tone.OK, OK, "Takes new requests."),
    "draining": State("Draining", Tone.WARN, UNDER_WAY, "Takes no new requests; the ones in "
                      "flight finish."),
    "drained": State("Drained", Tone.OFF, INACTIVE, "Takes no requests until it is resumed."),
    "disabled": State("Disabled", Tone.OFF, TURNED_OFF, "Turned off: takes no requests."),
}  # fmt: skip

HEALTH_STATES = {
    "healthy": State("Healthy", Tone.OK, OK, "Answers its probes and requests."),
    "degraded": State("Degraded", Tone.WARN, WARNING, "Its latest probe failed: used only when "
                      "no healthy target has room."),
    "ejected": State("Ejected", Tone.BAD, FAILED, "Real requests failed: no traffic until a "
                     "trial request succeeds."),
    "unhealthy": State("Unhealthy", Tone.BAD, FAILED, "Failed its probes: takes no traffic."),
    "node_offline": State("Node offline", Tone.BAD, FAILED, "Its node does not answer: takes "
                          "no traffic."),
    "node_untrusted": State("Node not trusted", Tone.BAD, FAILED, "Its node is not trusted: "
                            "takes no traffic."),
}  # fmt: skip

# Services and their routes (replicas) share one vocabulary.
SERVING_STATES = {
    "preparing": State("Preparing", Tone.WARN, UNDER_WAY, "Starting; not serving yet."),
    "ready": State("Ready", Tone.OK, OK, "Serving."),
    "degraded": State("Degraded", Tone.WARN, WARNING, "Serving, but its latest probe failed."),
    "unhealthy": State("Unhealthy", Tone.BAD, FAILED, "Failed its health checks: takes no "
                       "traffic and is replaced."),
    "failed": State("Failed", Tone.BAD, FAILED, "Could not start."),
    "terminating": State("Terminating", Tone.WARN, UNDER_WAY, "Stopping."),
    "terminated": State("Terminated", Tone.OFF, INACTIVE, "Stopped."),
    "scaled_to_zero": State("Scaled to 0", Tone.OFF, INACTIVE, "Keeps no replicas."),
    "destroying": State("Destroying", Tone.WARN, UNDER_WAY, "Its replicas are stopping."),
    "destroyed": State("Destroyed", Tone.OFF, INACTIVE, "Gone; kept for its history."),
}  # fmt: skip

REVISION_STATES = {
    "pending": State("Pending", Tone.INFO, INFO, "Made; not rolled out yet."),
    "rolling_out": State("Rolling out", Tone.WARN, UNDER_WAY, "Its replicas are starting."),
    "running": State("Running", Tone.OK, OK, "Every ready replica runs it."),
    "rolled_back": State("Rolled back", Tone.BAD, FAILED, "Never became healthy."),
    "superseded": State("Superseded", Tone.OFF, INACTIVE, "A later revision replaced it."),
}

DEPLOYMENT_STATES = {
    "queued": State("Queued", Tone.INFO, INFO, "Waiting for a worker to start it."),
    "running": State("Running", Tone.WARN, UNDER_WAY, "Under way."),
    "succeeded": State("Succeeded", Tone.OK, OK, "Done."),
    "failed": State("Failed", Tone.BAD, FAILED, "Stopped with an error."),
}

NODE_STATES = {
    "pending": State("Pending confirmation", Tone.WARN, WARNING, "Gets nothing until an "
                     "operator confirms its fingerprint."),
    "unknown": State("Not seen yet", Tone.INFO, INFO, "Trusted; has not answered a refresh yet."),
    "online": State("Online", Tone.OK, OK, "Trusted and answering."),
    "offline": State("Offline", Tone.BAD, FAILED, "Does not answer: no traffic and no work."),
    "rejected": State("Rejected", Tone.OFF, TURNED_OFF, "Refused by an operator: no traffic and "
                      "no work."),
}  # fmt: skip

TOKEN_STATES = {
    "valid": State("Valid", Tone.OK, OK, "Works."),
    "expired": State("Expired", Tone.WARN, WARNING, "Past its expiry: refused."),
    "revoked": State("Revoked", Tone.OFF, TURNED_OFF, "Revoked: refused."),
}

TRIAL_STATES = {
    "queued": State("Queued", Tone.INFO, INFO, "Waiting for the worker to start it."),
    "running": State("Running", Tone.WARN, UNDER_WAY, "A trial replica runs and is probed."),
    "passed": State("Passed", Tone.OK, OK, "A health probe passed; the replica was stopped."),
    "failed": State("Failed", Tone.BAD, FAILED, "It did not pass; the replica was stopped."),
}

# An autoscaling rule's outcome in one cycle (serving.autoscaling.Outcome), as a scale event.
SCALE_STATES = {
    "scaled_out": State("Scaled out", Tone.OK, OK, "The rule raised the replica count."),
    "scaled_in": State("Scaled in", Tone.OK, OK, "The rule lowered the replica count."),
    "within": State("Within thresholds", Tone.INFO, INFO, "The metric is inside the range."),
    "at_bound": State("At bound", Tone.INFO, INFO, "Fired, but the count is at min or max."),
    "cooldown": State("Cooling down", Tone.INFO, INFO, "Fired, but a cooldown holds it back."),
    "overruled": State("Overruled", Tone.OFF, INACTIVE, "Fired, but a scale-out rule won."),
    "no_data": State("No data", Tone.WARN, WARNING, "No fresh samples: nothing is decided."),
}

# A routed request's outcome (pools.models.RoutingOutcome): what the client got.
OUTCOME_STATES = {
    "ok": State("OK", Tone.OK, OK, "Answered by a target."),
    "client_error": State("Client error", Tone.WARN, WARNING, "The request's own fault (4xx)."),
    "upstream_error": State("Upstream error", Tone.BAD, FAILED, "The target failed it."),
    "queue_full": State("Queue full", Tone.BAD, FAILED, "Refused: the pool's queue was full."),
    "queue_timeout": State(
        "Queue timeout", Tone.BAD, FAILED, "No slot freed within the queue's wait."
    ),
    "no_target": State("No target", Tone.BAD, FAILED, "No target could take it."),
    "interrupted": State("Interrupted", Tone.BAD, FAILED, "The answer broke off after output."),
    "client_gone": State("Client gone", Tone.OFF, INACTIVE, "The client left before the end."),
    "rate_limited": State("Rate limited", Tone.WARN, WARNING, "Over its token's limits."),
}


def _badge(kind: str, states: dict[str, State], state: str, detail: str, reason: str) -> Badge:
    try:
        known = states[state]
    except KeyError:
        raise ValueError(f"{state!r} is not a {kind} state; known: {', '.join(states)}") from None
    return Badge(
        kind=kind,
        state=state,
        label=known.label,
        tone=known.tone,
        icon=known.icon,
        detail=detail,
        reason=reason or known.reason,
    )


def target(state: str, *, enabled: bool = True, in_flight: int | None = None) -> Badge:
    """Return a target's traffic state: active, draining (N in flight), drained or disabled."""
    if not enabled:
        return _badge("target", TARGET_STATES, "disabled", "", "")
    # Values come from templates too, where a missing one is "".
    counted = state == "draining" and isinstance(in_flight, int)
    detail = f"{format.number(in_flight)} in flight" if counted else ""
    return _badge("target", TARGET_STATES, state, detail, "")


def health(
    state: str,
    *,
    trial_in_s: float | None = None,
    cause: str = "",
    node_trust: str = "",
    node_status: str = "",
    node_since: datetime | None = None,
    node_error: str = "",
    now: datetime | None = None,
) -> Badge:
    """Return a target's health: healthy, degraded, ejected (trial in N s, cause), unhealthy, or
    that of its node (offline since when, why; or not trusted), which outranks the target's own.
    The node's values are empty for a target on no node."""
    if node_trust and node_trust != "trusted":
        return _badge("health", HEALTH_STATES, "node_untrusted", node_trust, "")
    if node_status == "offline":
        since = f"since {format.ago(node_since, now or datetime.now(UTC))}" if node_since else ""
        reason = _joined(HEALTH_STATES["node_offline"].reason, node_error)
        return _badge("health", HEALTH_STATES, "node_offline", _joined(since, node_error), reason)
    if state == "ejected":
        trial = f"trial in {format.duration(trial_in_s)}" if trial_in_s is not None else ""
        return _badge("health", HEALTH_STATES, state, _joined(trial, cause), "")
    return _badge("health", HEALTH_STATES, state, cause if state != "healthy" else "", "")


def target_row(
    state: str,
    *,
    enabled: bool = True,
    in_flight: int | None = None,
    health_state: str = "healthy",
    **health_facts: Any,
) -> Badge:
    """Return the one badge a target's row shows: the worse of its traffic state and its health
    (`health_facts` as `health` takes them)."""
    return worst(
        target(state, enabled=enabled, in_flight=in_flight), health(health_state, **health_facts)
    )


def serving(state: str, *, detail: str = "", reason: str = "") -> Badge:
    """Return a service's or route's state in the serving vocabulary."""
    return _badge("serving", SERVING_STATES, state, detail, reason)


# Route.state values (serving.models.RouteState) in the serving vocabulary.
ROUTE_STATE_NAMES = {
    "provisioning": "preparing",
    "healthy": "ready",
    "unhealthy": "unhealthy",
    "terminating": "terminating",
    "terminated": "terminated",
    "failed_to_start": "failed",
}


def route(state: str, *, degraded: bool = False, reason: str = "") -> Badge:
    """Return a route's (replica's) state: a ready route whose latest probe failed is degraded."""
    name = "degraded" if degraded and state == "healthy" else ROUTE_STATE_NAMES.get(state, state)
    return serving(name, reason=reason)


def service(lifecycle: str, *, ready: int, desired: int, reason: str = "") -> Badge:
    """Return a service's state: destroying or destroyed by its lifecycle, else by its ready
    replicas: all ready, none ready yet (preparing), some (degraded), or none wanted."""
    if lifecycle in ("destroying", "destroyed"):
        return serving(lifecycle, reason=reason)
    if desired == 0:
        return serving("scaled_to_zero", reason=reason)
    if ready >= desired:
        return serving("ready", reason=reason)
    if ready == 0:
        return serving("preparing", reason=reason)
    return serving("degraded", reason=reason or "Fewer replicas ready than wanted.")


def revision(state: str, *, reason: str = "") -> Badge:
    """Return a service revision's state: pending, rolling out, running, rolled back (why) or
    superseded."""
    return _badge("revision", REVISION_STATES, state, "", reason)


def deployment(
    state: str, *, phase: str = "", percent: float | None = None, reason: str = ""
) -> Badge:
    """Return a deployment's (or one node's part's) state: queued, running (phase, %),
    succeeded or failed. A node part's "pending" is queued."""
    name = "queued" if state == "pending" else state
    detail = ""
    if name == "running":
        known = isinstance(percent, int | float)
        detail = _joined(phase, format.percent(percent, 100) if known else "")
    return _badge("deployment", DEPLOYMENT_STATES, name, detail, reason)


def node(
    trust: str,
    status: str = "unknown",
    *,
    since: datetime | None = None,
    error: str = "",
    now: datetime | None = None,
) -> Badge:
    """Return a node's state: pending, rejected, or (trusted) online, offline (since when, why)
    or not seen yet."""
    if trust in ("pending", "rejected"):
        return _badge("node", NODE_STATES, trust, "", error)
    if status == "offline":
        when = f"since {format.ago(since, now or datetime.now(UTC))}" if since else ""
        reason = _joined(NODE_STATES["offline"].reason, error)
        return _badge("node", NODE_STATES, "offline", _joined(when, error), reason)
    return _badge("node", NODE_STATES, status, "", "")


def token(state: str, *, reason: str = "") -> Badge:
    """Return a token's state: valid, expired or revoked."""
    return _badge("token", TOKEN_STATES, state, "", reason)


def trial(state: str, *, reason: str = "") -> Badge:
    """Return a Validate trial's state: queued, running, passed or failed (why)."""
    return _badge("trial", TRIAL_STATES, state, "", reason)


def scale(state: str, *, reason: str = "") -> Badge:
    """Return what an autoscaling rule came to: scaled out or in, or why it did not."""
    return _badge("scale", SCALE_STATES, state, "", reason)


def outcome(state: str, *, reason: str = "") -> Badge:
    """Return a routed request's outcome: OK, or what went wrong (the failure in the title)."""
    return _badge("outcome", OUTCOME_STATES, state, "", reason)


# What `{% badge "<kind>" ... %}` calls: the kind's builder with the tag's arguments.
BUILDERS: dict[str, Callable[..., Badge]] = {
    "target": target,
    "health": health,
    "target_row": target_row,
    "serving": serving,
    "route": route,
    "service": service,
    "revision": revision,
    "deployment": deployment,
    "node": node,
    "token": token,
    "trial": trial,
    "scale": scale,
    "outcome": outcome,
}

# Every state of every kind, for the style guide and the tests.
CATALOGUE: dict[str, dict[str, State]] = {
    "target": TARGET_STATES,
    "health": HEALTH_STATES,
    "serving": SERVING_STATES,
    "revision": REVISION_STATES,
    "deployment": DEPLOYMENT_STATES,
    "node": NODE_STATES,
    "token": TOKEN_STATES,
    "trial": TRIAL_STATES,
    "scale": SCALE_STATES,
    "outcome": OUTCOME_STATES,
}


def build(kind: str, *args: Any, **kwargs: Any) -> Badge:
    """Return the badge of a kind from the values a template passes."""
    try:
        builder = BUILDERS[kind]
    except KeyError:
        raise ValueError(f"{kind!r} is not a badge kind; known: {', '.join(BUILDERS)}") from None
    return builder(*args, **kwargs)


def plain(kind: str, state: str) -> Badge:
    """Return a state's badge with no detail, as the style guide lists them."""
    return _badge(kind, CATALOGUE[kind], state, "", "")
