"""One badge per state (nexus.ui.badges): its words, tone, shape and reason; a row shows the worst
that applies, so a page never says "Healthy" for something drained, ejected or offline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nexus.ui import badges
from nexus.ui.badges import Tone

NOW = datetime(2025, 1, 2, 13, 4, 5, tzinfo=UTC)
THREE_MIN_AGO = NOW - timedelta(minutes=3)


def shown(badge: badges.Badge) -> tuple[str, str, str]:
    return badge.text, str(badge.tone), badge.icon


@pytest.mark.parametrize(
    ("state", "enabled", "in_flight", "expected"),
    [
        ("active", True, None, ("Active", "ok", "✓")),
        ("draining", True, 3, ("Draining (3 in flight)", "warn", "◐")),
        ("draining", True, None, ("Draining", "warn", "◐")),
        ("drained", True, 0, ("Drained", "off", "○")),
        ("active", False, None, ("Disabled", "off", "⊘")),
        ("draining", False, 2, ("Disabled", "off", "⊘")),
    ],
)
def test_a_targets_traffic_state(
    state: str, enabled: bool, in_flight: int | None, expected: tuple[str, str, str]
) -> None:
    assert shown(badges.target(state, enabled=enabled, in_flight=in_flight)) == expected


@pytest.mark.parametrize(
    ("state", "facts", "expected"),
    [
        ("healthy", {}, ("Healthy", "ok", "✓")),
        ("degraded", {}, ("Degraded", "warn", "!")),
        ("degraded", {"cause": "probe timed out"}, ("Degraded (probe timed out)", "warn", "!")),
        ("ejected", {"trial_in_s": 12, "cause": "3 connect errors"},
         ("Ejected (trial in 12 s, 3 connect errors)", "bad", "✕")),
        ("unhealthy", {}, ("Unhealthy", "bad", "✕")),
        ("healthy", {"node_trust": "trusted", "node_status": "offline",
                     "node_since": THREE_MIN_AGO, "node_error": "connection refused"},
         ("Node offline (since 3 min ago, connection refused)", "bad", "✕")),
        ("degraded", {"node_trust": "rejected", "node_status": "online"},
         ("Node not trusted (rejected)", "bad", "✕")),
        ("healthy", {"node_trust": "trusted", "node_status": "online"}, ("Healthy", "ok", "✓")),
    ],
)  # fmt: skip
def test_a_targets_health(state: str, facts: dict, expected: tuple[str, str, str]) -> None:
    assert shown(badges.health(state, now=NOW, **facts)) == expected


def test_an_offline_nodes_reason_is_in_the_title() -> None:
    badge = badges.health(
        "healthy", node_trust="trusted", node_status="offline", node_error="connection refused"
    )

    assert badge.reason == "Its node does not answer: takes no traffic., connection refused"


@pytest.mark.parametrize(
    ("state", "facts", "expected"),
    [
        # Never "Healthy" for something drained, ejected or offline.
        ("drained", {}, "Drained"),
        ("active", {"health_state": "ejected", "trial_in_s": 4}, "Ejected (trial in 4.0 s)"),
        ("active", {"node_trust": "trusted", "node_status": "offline"}, "Node offline"),
        ("draining", {"in_flight": 2}, "Draining (2 in flight)"),
        ("drained", {"health_state": "degraded"}, "Degraded"),
        ("active", {"enabled": False, "health_state": "unhealthy"}, "Unhealthy"),
        ("active", {}, "Active"),
    ],
)
def test_a_target_row_shows_the_worst_state_that_applies(
    state: str, facts: dict, expected: str
) -> None:
    assert badges.target_row(state, **facts).text == expected


@pytest.mark.parametrize(
    ("state", "degraded", "expected"),
    [
        ("provisioning", False, ("Preparing", "warn", "◐")),
        ("healthy", False, ("Ready", "ok", "✓")),
        ("healthy", True, ("Degraded", "warn", "!")),
        ("unhealthy", False, ("Unhealthy", "bad", "✕")),
        ("failed_to_start", False, ("Failed", "bad", "✕")),
        ("terminating", False, ("Terminating", "warn", "◐")),
        ("terminated", False, ("Terminated", "off", "○")),
    ],
)
def test_a_routes_state(state: str, degraded: bool, expected: tuple[str, str, str]) -> None:
    assert shown(badges.route(state, degraded=degraded)) == expected


@pytest.mark.parametrize(
    ("lifecycle", "ready", "desired", "expected"),
    [
        ("active", 0, 2, ("Preparing", "warn", "◐")),
        ("active", 1, 2, ("Degraded", "warn", "!")),
        ("active", 2, 2, ("Ready", "ok", "✓")),
        ("active", 0, 0, ("Scaled to 0", "off", "○")),
        ("destroying", 1, 2, ("Destroying", "warn", "◐")),
        ("destroyed", 0, 2, ("Destroyed", "off", "○")),
    ],
)
def test_a_services_state(
    lifecycle: str, ready: int, desired: int, expected: tuple[str, str, str]
) -> None:
    assert shown(badges.service(lifecycle, ready=ready, desired=desired)) == expected


@pytest.mark.parametrize(
    ("state", "facts", "expected"),
    [
        ("pending", {}, ("Queued", "info", "i")),
        ("running", {"phase": "downloading", "percent": 42.0},
         ("Running (downloading, 42 %)", "warn", "◐")),
        ("running", {"phase": "installing"}, ("Running (installing)", "warn", "◐")),
        ("succeeded", {"phase": "done", "percent": 100.0}, ("Succeeded", "ok", "✓")),
        ("failed", {"reason": "sha256 mismatch"}, ("Failed", "bad", "✕")),
    ],
)  # fmt: skip
def test_a_deployments_state(state: str, facts: dict, expected: tuple[str, str, str]) -> None:
    assert shown(badges.deployment(state, **facts)) == expected


def test_a_failed_deployments_error_is_its_title() -> None:
    assert badges.deployment("failed", reason="sha256 mismatch").reason == "sha256 mismatch"


@pytest.mark.parametrize(
    ("trust", "status", "expected"),
    [
        ("pending", "online", ("Pending confirmation", "warn", "!")),
        ("rejected", "offline", ("Rejected", "off", "⊘")),
        ("trusted", "unknown", ("Not seen yet", "info", "i")),
        ("trusted", "online", ("Online", "ok", "✓")),
        ("trusted", "offline", ("Offline (since 3 min ago, connection refused)", "bad", "✕")),
    ],
)
def test_a_nodes_state(trust: str, status: str, expected: tuple[str, str, str]) -> None:
    badge = badges.node(trust, status, since=THREE_MIN_AGO, error="connection refused", now=NOW)

    assert shown(badge) == expected


@pytest.mark.parametrize(
    ("state", "expected"),
    [("valid", ("Valid", "ok", "✓")), ("expired", ("Expired", "warn", "!")),
     ("revoked", ("Revoked", "off", "⊘"))],
)  # fmt: skip
def test_a_tokens_state(state: str, expected: tuple[str, str, str]) -> None:
    assert shown(badges.token(state)) == expected


@pytest.mark.parametrize(
    ("state", "expected"),
    [("pending", ("Pending", "info", "i")), ("rolling_out", ("Rolling out", "warn", "◐")),
     ("running", ("Running", "ok", "✓")), ("rolled_back", ("Rolled back", "bad", "✕")),
     ("superseded", ("Superseded", "off", "○"))],
)  # fmt: skip
def test_a_revisions_state(state: str, expected: tuple[str, str, str]) -> None:
    assert shown(badges.revision(state)) == expected


def test_every_state_has_words_a_tone_a_shape_and_a_reason() -> None:
    for kind, states in badges.CATALOGUE.items():
        for state, look in states.items():
            assert look.label and look.reason, (kind, state)
            assert look.icon in {"✓", "◐", "!", "✕", "○", "⊘", "i"}, (kind, state)
    # The shape tells the meaning apart without colour: one shape never spans ok and failed.
    icons_by_tone: dict[Tone, set[str]] = {}
    for states in badges.CATALOGUE.values():
        for look in states.values():
            icons_by_tone.setdefault(look.tone, set()).add(look.icon)
    assert icons_by_tone[Tone.OK] == {"✓"}
    assert icons_by_tone[Tone.BAD] == {"✕"}


def test_the_worst_badge_is_the_most_severe_and_the_first_of_equals() -> None:
    active, healthy = badges.target("active"), badges.health("healthy")
    drained, degraded = badges.target("drained"), badges.health("degraded")

    assert badges.worst(active, healthy) is active
    assert badges.worst(healthy, drained) is drained
    assert badges.worst(drained, degraded, None) is degraded
    with pytest.raises(ValueError, match="at least one badge"):
        badges.worst()


def test_an_unknown_state_or_kind_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'paused' is not a target state; known: active"):
        badges.target("paused")
    with pytest.raises(ValueError, match=r"'pool' is not a badge kind"):
        badges.build("pool", "ready")
