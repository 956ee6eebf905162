"""Validate a pool: ask each target what it serves and how much it runs at once; check the pool.

Per target: reachable, answers `GET /models`, serves the pool's model id, its credential is
accepted, each configured kind answers a one-token request (only when the operator asks: that is
real inference), and its capacity against the concurrency its runtime reports. Per pool: an Exact
replicas pool needs every target to be provably the same model, else an operator's stored
confirmation; an Equivalent generation pool is warned about differing context lengths and kinds.
The judging functions are pure (facts in, checks out); `validate` gathers the facts over HTTP.
docs/pools-console.md says what each check means.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import httpx

from nodes import services as node_services
from pools.models import CompatibilityMode, IdentityConfirmation, Pool, Target

PROBE_TIMEOUT_S = 5.0
MAX_PARALLEL = 8
PROBE_TEXT = "Say OK."


class Severity(StrEnum):
    """How much a check's result matters; the badges' tones."""

    OK = "ok"
    INFO = "info"
    WARN = "warn"
    BAD = "bad"


@dataclass(frozen=True)
class Check:
    """One thing checked, its verdict and why."""

    name: str
    severity: Severity
    detail: str


@dataclass
class TargetFacts:
    """What a target told about itself."""

    reachable: bool = False
    status: int | None = None  # of GET /models
    error: str = ""
    served: list[str] = field(default_factory=list)
    context_length: int | None = None
    concurrency: int | None = None  # what its runtime runs at once, when it says
    concurrency_source: str = ""
    kinds: dict[str, str] = field(default_factory=dict)  # kind -> "" (answered) or the problem


@dataclass
class TargetReport:
    """A target's checks, worst first."""

    target_id: int
    name: str
    checks: list[Check]
    context_length: int | None
    concurrency: int | None

    @property
    def severity(self) -> Severity:
        return worst(check.severity for check in self.checks)


@dataclass
class PoolReport:
    """A pool's validation: per target, and for the pool as a whole."""

    pool: str
    mode: str
    targets: list[TargetReport]
    checks: list[Check]
    # An Exact-replicas pool whose identity is unproven and not confirmed for these targets.
    needs_confirmation: bool
    confirmation: dict[str, Any] | None
    probed_kinds: bool

    @property
    def severity(self) -> Severity:
        every = [check.severity for check in self.checks]
        every += [report.severity for report in self.targets]
        return worst(every)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-ready data (the API's answer)."""
        data = asdict(self)
        data["severity"] = self.severity.value
        for report, target in zip(self.targets, data["targets"], strict=True):
            target["severity"] = report.severity.value
        return data


ORDER = [Severity.OK, Severity.INFO, Severity.WARN, Severity.BAD]


def worst(severities: Any) -> Severity:
    return max(severities, key=ORDER.index, default=Severity.OK)


# -- judging (pure) ---------------------------------------------------------------------------


def capacity_check(
    capacity: int, concurrency: int | None, source: str, *, on_node: bool = False
) -> Check:
    """Compare a target's capacity with what its runtime runs at once."""
    if concurrency is None and on_node:
        # Not asked (see gather): the agent's URL answers for all the node's runtimes.
        return Check(
            "capacity", Severity.INFO,
            f"Capacity {capacity}; a node's agent answers for several runtimes and does not say "
            "how many requests one runs at once: keep it at most what this one runs.",
        )  # fmt: skip
    if concurrency is None:
        return Check(
            "capacity", Severity.INFO,
            f"Capacity {capacity}; its runtime does not say how many requests it runs at once "
            "(a provider endpoint, or a runtime without a way to ask): keep it at most that.",
        )  # fmt: skip
    if capacity > concurrency:
        return Check(
            "capacity", Severity.WARN,
            f"Capacity {capacity} is above the {concurrency} its engine runs at once ({source}): "
            f"requests beyond {concurrency} would wait inside the runtime where Nexus cannot "
            "move them.",
        )  # fmt: skip
    return Check(
        "capacity", Severity.OK,
        f"Capacity {capacity} of the {concurrency} its engine runs at once ({source}).",
    )  # fmt: skip


def target_checks(target: Target, facts: TargetFacts, *, probed: bool) -> list[Check]:
    """Return a target's checks from what it told."""
    if not facts.reachable:
        return [Check("reachable", Severity.BAD, f"No answer at {target.base_url}: {facts.error}")]
    checks = [Check("reachable", Severity.OK, f"Answers at {target.base_url}.")]
    if facts.status in (401, 403):
        checks.append(
            Check("credential", Severity.BAD, f"GET /models answered {facts.status}: the "
                  "credential is refused.")
        )  # fmt: skip
        return checks
    if facts.status != 200:
        checks.append(Check("models", Severity.BAD, f"GET /models answered {facts.status}."))
        return checks
    if target.upstream_credential():
        checks.append(Check("credential", Severity.OK, "The credential is accepted."))
    listed = ", ".join(facts.served) or "none"
    checks.append(Check("models", Severity.OK, f"GET /models lists {listed}."))
    if target.model_id in facts.served:
        checks.append(Check("model", Severity.OK, f"Serves {target.model_id}."))
    else:
        checks.append(
            Check("model", Severity.BAD, f"Does not list {target.model_id}: requests would fail.")
        )
    if probed:
        for kind, problem in facts.kinds.items():
            if problem:
                checks.append(Check(f"kind {kind}", Severity.BAD, problem))
            else:
                checks.append(Check(f"kind {kind}", Severity.OK, "Answered a one-token request."))
    else:
        kinds = ", ".join(target.kinds)
        checks.append(
            Check("kinds", Severity.INFO, f"Configured: {kinds}; not probed (ask for the "
                  "one-token probe to check each).")
        )  # fmt: skip
    checks.append(
        capacity_check(
            target.capacity_weight,
            facts.concurrency,
            facts.concurrency_source,
            on_node=target.node_id is not None,
        )
    )
    return sorted(checks, key=lambda check: -ORDER.index(check.severity))


@dataclass(frozen=True)
class Identity:
    """What proves a target's model: its model id and, on a node, the content digest."""

    target_id: int
    name: str
    model_id: str
    base_url: str
    digest: str  # empty: unknown (a provider, a runtime URL, or a node that gave none)


def identity_problems(identities: Sequence[Identity]) -> list[str]:
    """Return why these targets are not provably one model; empty when they are."""
    problems = []
    names = sorted({identity.model_id for identity in identities})
    if len(names) > 1:
        problems.append(f"Different model names: {', '.join(names)}.")
    unknown = [identity.name for identity in identities if not identity.digest]
    if unknown:
        problems.append(
            f"No content digest for {', '.join(unknown)}: a provider or a runtime URL does not "
            "show its build."
        )
    digests = {identity.digest for identity in identities if identity.digest}
    if len(digests) > 1:
        problems.append("The nodes report different content digests.")
    return problems


def _short(digest: str) -> str:
    """Return a digest as an operator can compare it at a glance: sha256:0123456789ab…"""
    kind, _, value = digest.rpartition(":")
    head = f"{kind}:" if kind else ""
    return f"{head}{value[:12]}…" if len(value) > 12 else digest


def _names(values: set[str]) -> str:
    ordered = sorted(values)
    return ordered[0] if len(ordered) == 1 else ", ".join(ordered[:-1]) + " and " + ordered[-1]


def identity_refusal(candidate: Identity, others: Sequence[Identity]) -> str:
    """Return why a target may not join (or stay in) an Exact-replicas pool beside the others,
    "" when nothing stored says it serves another model.

    Only what is stored counts: the model id it is configured with (the `/v1/models` id it is
    sent), and the content digest of the model file where a node's inventory has one. A digest
    unknown on either side proves nothing either way: that is the recorded confirmation's case.
    """
    if not others:
        return ""
    models = {other.model_id for other in others}
    if candidate.model_id not in models:
        return (
            f"{candidate.name} serves {candidate.model_id}, the pool's targets serve "
            f"{_names(models)}: an Exact-replicas pool's targets serve one model."
        )
    digests = {other.digest for other in others if other.digest}
    if candidate.digest and digests and candidate.digest not in digests:
        return (
            f"{candidate.name}'s model file has digest {_short(candidate.digest)}, which differs "
            f"from {_names({_short(d) for d in digests})} on the pool's targets: an "
            "Exact-replicas pool's targets serve one model file."
        )
    return ""


def mode_refusal(identities: Sequence[Identity]) -> str:
    """Return why these targets cannot form an Exact-replicas pool, "" when nothing stored
    says they serve different models (unproven identities still need the confirmation)."""
    models: dict[str, list[str]] = {}
    for identity in identities:
        models.setdefault(identity.model_id, []).append(identity.name)
    if len(models) > 1:
        serving = "; ".join(
            f"{', '.join(sorted(names))} {'serves' if len(names) == 1 else 'serve'} {model}"
            for model, names in sorted(models.items())
        )
        return f"The targets serve different models ({serving}): make them one model first."
    digests = {identity.digest for identity in identities if identity.digest}
    if len(digests) > 1:
        shown = _names({_short(digest) for digest in digests})
        return (
            f"The nodes report different model file digests ({shown}): the targets do not "
            "serve one model file."
        )
    return ""


def confirmation_covers(confirmation: IdentityConfirmation, identities: Sequence[Identity]) -> bool:
    """Say whether a stored confirmation was given for exactly these targets and model ids."""
    confirmed = {(entry["id"], entry["model_id"]) for entry in confirmation.targets}
    return confirmed == {(identity.target_id, identity.model_id) for identity in identities}


def generation_warnings(targets: Sequence[Target], reports: Sequence[TargetReport]) -> list[Check]:
    """Return an Equivalent-generation pool's warnings: context lengths and kinds that differ."""
    checks = []
    lengths = {r.name: r.context_length for r in reports if r.context_length is not None}
    if len(set(lengths.values())) > 1:
        told = ", ".join(f"{name} {length:,}" for name, length in sorted(lengths.items()))
        checks.append(
            Check("context length", Severity.WARN, f"Context lengths differ ({told}): a long "
                  "prompt may fit one target and fail on another.")
        )  # fmt: skip
    kinds = {target.name: tuple(sorted(target.kinds)) for target in targets}
    if len(set(kinds.values())) > 1:
        told = "; ".join(f"{name}: {', '.join(k)}" for name, k in sorted(kinds.items()))
        checks.append(
            Check("kinds", Severity.WARN, f"Kinds differ ({told}): some requests have fewer "
                  "targets.")
        )  # fmt: skip
    if not checks:
        checks.append(Check("equivalence", Severity.OK, "Context lengths and kinds agree."))
    return checks


# -- gathering facts over HTTP ----------------------------------------------------------------


def root_url(base_url: str) -> str:
    """Return the server root of an OpenAI base URL (http://h:8000/v1 -> http://h:8000)."""
    trimmed = base_url.rstrip("/")
    return trimmed[: -len("/v1")] if trimmed.endswith("/v1") else trimmed


# Where each runtime says how many requests it runs at once (nodes.runtimes' catalogue names
# them): the path, the keys down to the figure in its JSON answer, and the words for the report.
# vLLM's /server_info is its full configuration (older releases serve it only with
# VLLM_SERVER_DEV_MODE=1; where it is missing the capacity is not known).
CONCURRENCY_SOURCES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("/sim/stats", ("concurrency",), "the simulator's --concurrency"),
    ("/props", ("total_slots",), "llama.cpp's total_slots"),
    ("/get_server_info", ("max_running_requests",), "SGLang's max_running_requests"),
    (
        "/server_info?config_format=json",
        ("vllm_config", "scheduler_config", "max_num_seqs"),
        "vLLM's max_num_seqs",
    ),
)


def detect_concurrency(client: httpx.Client, base_url: str) -> tuple[int | None, str]:
    """Return the requests the runtime behind this URL runs at once, and how that was learnt."""
    root = root_url(base_url)
    for path, keys, source in CONCURRENCY_SOURCES:
        try:
            answer = client.get(root + path)
            value = answer.json() if answer.status_code == 200 else None
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
        except (httpx.HTTPError, ValueError):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, source
    return None, ""


def detect_runtime_concurrency(base_url: str) -> tuple[int | None, str]:
    """Return what the runtime at this URL runs at once, and how that was learnt (no key sent:
    runtimes tell it without one; providers tell nothing)."""
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
        return detect_concurrency(client, base_url)


def kind_problem(client: httpx.Client, target: Target, kind: str) -> str:
    """Send one one-token request of this kind; return the problem, empty when it answered."""
    base = target.base_url.rstrip("/")
    model = target.model_id
    path, body = {
        "chat": ("/chat/completions", {"model": model, "max_tokens": 1,
                                       "messages": [{"role": "user", "content": PROBE_TEXT}]}),
        "completions": ("/completions", {"model": model, "max_tokens": 1, "prompt": PROBE_TEXT}),
        "embeddings": ("/embeddings", {"model": model, "input": PROBE_TEXT}),
    }[kind]  # fmt: skip
    try:
        answer = client.post(base + path, json=body)
    except httpx.HTTPError as exc:
        return f"POST {path} failed: {type(exc).__name__}"
    if answer.status_code != 200:
        return f"POST {path} answered {answer.status_code}."
    return ""


def gather(target: Target, *, probe_kinds: bool) -> TargetFacts:
    """Ask the target what it serves (and, when asked, send one-token requests)."""
    facts = TargetFacts()
    headers = {}
    if credential := target.upstream_credential():
        headers["Authorization"] = f"Bearer {credential}"
    with httpx.Client(headers=headers, timeout=PROBE_TIMEOUT_S) as client:
        try:
            answer = client.get(target.base_url.rstrip("/") + "/models")
        except httpx.HTTPError as exc:
            facts.error = type(exc).__name__
            return facts
        facts.reachable, facts.status = True, answer.status_code
        if answer.status_code != 200:
            return facts
        try:
            entries = [entry for entry in answer.json().get("data", []) if isinstance(entry, dict)]
        except (ValueError, AttributeError):
            entries = []
        facts.served = [str(entry.get("id")) for entry in entries if entry.get("id")]
        for entry in entries:
            if entry.get("id") == target.model_id:
                length = entry.get("max_model_len") or entry.get("context_length")
                facts.context_length = length if isinstance(length, int) else None
        if target.node_id is None:
            # A node's agent answers for all its runtimes: it is asked nothing more here.
            facts.concurrency, facts.concurrency_source = detect_concurrency(
                client, target.base_url
            )
        if probe_kinds:
            facts.kinds = {kind: kind_problem(client, target, kind) for kind in target.kinds}
    return facts


def identity_of(target: Target) -> Identity:
    digest = node_services.model_digest(target.node, target.model_id) if target.node else ""
    return Identity(target.pk, target.name, target.model_id, target.base_url, digest)


def validate(
    pool: Pool, *, probe_kinds: bool = False, targets: Sequence[Target] | None = None
) -> PoolReport:
    """Validate every target of the pool and the pool as a whole; change nothing.

    `targets`: a pool not created yet (the create-pool wizard's draft) passes its targets as
    unsaved instances, each with its pool, node, URL, model id, kinds and credential.
    """
    targets = list(targets) if targets is not None else list(pool.targets.select_related("node"))
    # Asked at once (gathering touches no database): a pool's wait is its slowest target's.
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets) or 1)) as executor:
        gathered = list(executor.map(lambda t: gather(t, probe_kinds=probe_kinds), targets))
    reports = []
    for target, facts in zip(targets, gathered, strict=True):
        reports.append(
            TargetReport(
                target_id=target.pk,
                name=target.name,
                checks=target_checks(target, facts, probed=probe_kinds),
                context_length=facts.context_length,
                concurrency=facts.concurrency,
            )
        )
    checks: list[Check] = []
    needs_confirmation = False
    latest = pool.identity_confirmations.first() if pool.pk is not None else None
    confirmation = None
    if pool.compatibility_mode == CompatibilityMode.EXACT_REPLICAS and targets:
        identities = [identity_of(target) for target in targets]
        problems = identity_problems(identities)
        if not problems:
            checks.append(Check("identity", Severity.OK, "Every target serves the same model "
                                "(same name and content digest)."))  # fmt: skip
        elif latest is not None and confirmation_covers(latest, identities):
            confirmation = confirmation_dict(latest)
            checks.append(
                Check("identity", Severity.OK, f"Not provable ({' '.join(problems)}) but "
                      f"confirmed by {latest.confirmed_by_name}.")
            )  # fmt: skip
        else:
            needs_confirmation = True
            checks.append(
                Check("identity", Severity.WARN, " ".join(problems) + " Confirm that every "
                      "target serves the same model, or make the pool Equivalent generation.")
            )  # fmt: skip
    elif pool.compatibility_mode == CompatibilityMode.EQUIVALENT_GENERATION:
        checks += generation_warnings(targets, reports)
    return PoolReport(
        pool=pool.slug,
        mode=pool.compatibility_mode,
        targets=reports,
        checks=checks,
        needs_confirmation=needs_confirmation,
        confirmation=confirmation,
        probed_kinds=probe_kinds,
    )


def confirmation_dict(confirmation: IdentityConfirmation) -> dict[str, Any]:
    return {
        "confirmed_by": confirmation.confirmed_by_name,
        "confirmed_at": confirmation.confirmed_at.isoformat(),
        "targets": confirmation.targets,
    }


def confirm_identity(pool: Pool, user: Any) -> IdentityConfirmation:
    """Store an operator's confirmation that the pool's targets, as they are now, serve one
    model."""
    targets = [
        {"id": t.pk, "name": t.name, "model_id": t.model_id, "base_url": t.base_url}
        for t in pool.targets.all()
    ]
    return IdentityConfirmation.objects.create(
        pool=pool,
        confirmed_by=user if getattr(user, "pk", None) else None,
        confirmed_by_name=getattr(user, "username", "") or "unknown",
        targets=targets,
    )
