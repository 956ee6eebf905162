"""Validate asks each target (real engines) and judges the pool: reachability, the model, the
credential, each kind when asked, capacity against the engine's concurrency; an Exact-replicas
pool needs proof or a stored confirmation; an Equivalent-generation pool is warned of what
differs. The page and the API give the same report."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client
from rest_framework.test import APIClient

from pools import validation
from pools.models import IdentityConfirmation, Target
from pools.validation import Identity, Severity
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.ports import free_port
from tests.support.simulator import Simulator, running_simulator

pytestmark = pytest.mark.django_db

CAPACITY_WARNING = (
    "Capacity 12 is above the 8 its engine runs at once (the simulator's --concurrency): "
    "requests beyond 8 would wait inside the runtime where Nexus cannot move them."
)


@pytest.fixture(scope="module")
def engine() -> Iterator[Simulator]:
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=0, concurrency=8) as sim:
        yield sim


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(make_user("operator", staff=True))
    return client


def checks_of(report: validation.PoolReport, name: str) -> dict[str, tuple[str, str]]:
    [target] = [t for t in report.targets if t.name == name]
    return {check.name: (check.severity.value, check.detail) for check in target.checks}


def test_a_target_above_its_engines_concurrency_is_warned(engine: Simulator) -> None:
    pool = make_pool("chat")
    make_target(pool, "sim", base_url=engine.base_url, model_id="demo-8b", capacity_weight=12)

    report = validation.validate(pool)

    checks = checks_of(report, "sim")
    assert checks["capacity"] == ("warn", CAPACITY_WARNING)
    assert checks["reachable"][0] == "ok"
    assert checks["model"] == ("ok", "Serves demo-8b.")
    assert checks["kinds"][0] == "info"  # not probed unless asked


def test_a_target_within_its_engines_concurrency_passes(engine: Simulator) -> None:
    pool = make_pool("chat")
    make_target(pool, "sim", base_url=engine.base_url, model_id="demo-8b", capacity_weight=8)

    checks = checks_of(validation.validate(pool), "sim")

    assert checks["capacity"] == (
        "ok", "Capacity 8 of the 8 its engine runs at once (the simulator's --concurrency).",
    )  # fmt: skip


def test_a_capacity_not_known_says_why_for_a_node_and_for_a_runtime_or_provider() -> None:
    on_node = validation.capacity_check(4, None, "", on_node=True)
    elsewhere = validation.capacity_check(4, None, "")

    assert on_node.severity == elsewhere.severity == Severity.INFO
    assert "a node's agent answers for several runtimes" in on_node.detail
    assert "provider endpoint" not in on_node.detail
    assert "(a provider endpoint, or a runtime without a way to ask)" in elsewhere.detail


def test_the_one_token_probe_checks_each_kind_only_when_asked(engine: Simulator) -> None:
    pool = make_pool("chat")
    make_target(pool, "sim", base_url=engine.base_url, model_id="demo-8b", kinds=["chat"])
    before = engine.stats()["requests_total"]

    checks = checks_of(validation.validate(pool, probe_kinds=True), "sim")

    assert checks["kind chat"] == ("ok", "Answered a one-token request.")
    assert engine.stats()["requests_total"] == before + 1


def test_an_unreachable_target_and_a_missing_model_are_failures(engine: Simulator) -> None:
    pool = make_pool("chat")
    make_target(pool, "gone", base_url=f"http://127.0.0.1:{free_port()}/v1")
    make_target(pool, "wrong", base_url=engine.base_url, model_id="llama-70b")

    report = validation.validate(pool)

    assert checks_of(report, "gone")["reachable"][0] == "bad"
    assert checks_of(report, "wrong")["model"] == (
        "bad", "Does not list llama-70b: requests would fail.",
    )  # fmt: skip
    assert report.severity == Severity.BAD


def test_identity_is_proven_by_one_name_and_one_digest_only() -> None:
    same = [Identity(1, "a", "m", "", "sha256:aa"), Identity(2, "b", "m", "", "sha256:aa")]
    provider = [Identity(1, "a", "m", "", "sha256:aa"), Identity(2, "openai", "m", "", "")]
    renamed = [Identity(1, "a", "m", "", "sha256:aa"), Identity(2, "b", "m2", "", "sha256:aa")]

    assert validation.identity_problems(same) == []
    assert validation.identity_problems(provider) == [
        "No content digest for openai: a provider or a runtime URL does not show its build."
    ]
    assert validation.identity_problems(renamed) == ["Different model names: m, m2."]


def test_an_exact_replicas_pool_needs_a_confirmation_for_exactly_its_targets(
    engine: Simulator, operator: Client
) -> None:
    pool = make_pool("chat", compatibility_mode="exact_replicas")
    make_target(pool, "sim", base_url=engine.base_url, model_id="demo-8b")
    make_target(pool, "openai", base_url=engine.base_url, model_id="demo-8b", credential="sk-x")

    before = validation.validate(pool)
    assert before.needs_confirmation
    page = operator.get("/pools/chat/validate/?run=1").content.decode()
    assert "Confirm these 2 targets serve one model" in page

    operator.post("/pools/chat/validate/confirm/")
    after = validation.validate(pool)

    assert not after.needs_confirmation
    [identity] = after.checks
    assert identity.severity == Severity.OK
    assert identity.detail.endswith("confirmed by operator.")
    stored = IdentityConfirmation.objects.get(pool=pool)
    assert [entry["name"] for entry in stored.targets] == ["sim", "openai"]
    shown = operator.get("/pools/chat/").content.decode()
    assert "Identity confirmed by <strong>operator</strong>" in shown

    # A target added since is not covered: confirm again.
    make_target(pool, "third", base_url=engine.base_url, model_id="demo-8b")
    assert validation.validate(pool).needs_confirmation


def test_an_equivalent_generation_pool_is_warned_of_different_kinds(engine: Simulator) -> None:
    pool = make_pool("chat", compatibility_mode="equivalent_generation")
    make_target(pool, "a", base_url=engine.base_url, model_id="demo-8b", kinds=["chat"])
    make_target(pool, "b", base_url=engine.base_url, model_id="demo-8b")

    [kinds] = validation.validate(pool).checks

    assert (kinds.name, kinds.severity) == ("kinds", Severity.WARN)


def test_the_api_gives_the_same_report(owner: APIClient, engine: Simulator) -> None:
    pool = make_pool("chat", compatibility_mode="equivalent_generation")
    make_target(pool, "sim", base_url=engine.base_url, model_id="demo-8b", capacity_weight=12)

    report = owner.post("/api/v1/pools/chat/validate/", {}, format="json").json()

    assert report["severity"] == "warn"
    [target] = report["targets"]
    capacity = next(check for check in target["checks"] if check["name"] == "capacity")
    assert capacity == {"name": "capacity", "severity": "warn", "detail": CAPACITY_WARNING}
    assert target["concurrency"] == 8


def test_the_api_stores_a_confirmation(owner: APIClient) -> None:
    pool = make_pool("chat")
    make_target(pool, "a")

    answer = owner.post("/api/v1/pools/chat/confirm-identity/")

    assert answer.status_code == 201
    assert [entry["name"] for entry in answer.json()["targets"]] == ["a"]
    assert IdentityConfirmation.objects.filter(pool=pool).count() == 1


def test_a_target_added_without_a_capacity_takes_its_engines_concurrency(
    engine: Simulator, operator: Client
) -> None:
    make_pool("chat", name="Chat")

    response = operator.post(
        "/pools/chat/targets/add/",
        {"name": "sim", "base_url": engine.base_url, "model_id": "demo-8b", "kinds": ["chat"],
         "priority": "1", "capacity_weight": ""},
        follow=True,
    )  # fmt: skip

    assert Target.objects.get(name="sim").capacity_weight == 8
    assert "sim added to Chat. Capacity 8: the simulator&#x27;s --concurrency" in (
        response.content.decode()
    )
