"""The History pages' reading of the routing history: filters, keyset pages, and the decisions
of each attempt laid out for a person (docs/history.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.db.models import Q, QuerySet

from pools.models import Pool, RequestKind, RoutingOutcome, RoutingRecord, Target

PAGE_SIZE = 50
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class HistoryFilterForm(forms.Form):
    """The history list's filters; every one is optional and they combine with AND."""

    pool = forms.ChoiceField(required=False)
    target = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    outcome = forms.ChoiceField(
        required=False, choices=[("", "Any outcome"), *RoutingOutcome.choices]
    )
    kind = forms.ChoiceField(required=False, choices=[("", "Any kind"), *RequestKind.choices])
    token = forms.CharField(required=False, max_length=100, label="Token name")
    since = forms.DateTimeField(
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        label="From (UTC)",
    )
    until = forms.DateTimeField(
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        label="Before (UTC)",
    )
    request_id = forms.CharField(required=False, max_length=32, label="Request id")
    retried = forms.BooleanField(required=False, label="Was retried")
    queued_over_ms = forms.FloatField(required=False, min_value=0, label="Queued longer than (ms)")

    def __init__(self, data: Any, pools: QuerySet[Pool]) -> None:
        super().__init__(data)
        pool_field = self.fields["pool"]
        target_field = self.fields["target"]
        assert isinstance(pool_field, forms.ChoiceField)
        assert isinstance(target_field, forms.ChoiceField)
        pool_field.choices = [
            ("", "Any pool"),
            *pools.order_by("slug").values_list("slug", "name"),
        ]
        targets = Target.objects.filter(pool__in=pools).select_related("pool")
        target_field.choices = [
            ("", "Any target"),
            *((t.pk, f"{t.pool.slug} / {t.name}") for t in targets.order_by("pool__slug", "name")),
        ]

    def narrow(self, records: QuerySet[RoutingRecord]) -> QuerySet[RoutingRecord]:
        """Return the records that pass every filter given (all of them while the form is bad)."""
        if not self.is_valid():
            return records
        wanted = self.cleaned_data
        lookups = {
            "pool": "pool__slug",
            "target": "target_id",
            "outcome": "outcome",
            "kind": "kind",
            "token": "token_name",
            "since": "created_at__gte",
            "until": "created_at__lt",
            "request_id": "request_id",
            "queued_over_ms": "queue_wait_ms__gt",
        }
        given = {lookups[name]: wanted[name] for name in lookups if wanted[name] not in ("", None)}
        if wanted["retried"]:
            given["attempt_count__gt"] = 1
        return records.filter(**given)


# -- keyset pages --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """A row's place in the history's order (newest first): its arrival time and id."""

    created_at: datetime
    id: int

    def encode(self) -> str:
        """Return the cursor as URL text: microseconds since the epoch, then the id."""
        micros = (self.created_at - EPOCH) // timedelta(microseconds=1)
        return f"{micros}-{self.id}"

    @classmethod
    def decode(cls, text: str) -> Cursor | None:
        """Return the cursor `encode` wrote, or None for anything else."""
        micros, _, pk = text.partition("-")
        if not (micros.isdigit() and pk.isdigit()):
            return None
        return cls(EPOCH + timedelta(microseconds=int(micros)), int(pk))

    @classmethod
    def of(cls, record: RoutingRecord) -> Cursor:
        return cls(record.created_at, record.pk)


@dataclass(frozen=True)
class Page:
    """One page of records, newest first, with the cursors of its neighbours."""

    records: list[RoutingRecord]
    number: int
    older: str | None  # `after` of the next (older) page, None on the last
    newer: str | None  # `before` of the previous (newer) page, None on the first


def page_of(
    records: QuerySet[RoutingRecord],
    *,
    after: str = "",
    before: str = "",
    number: int = 1,
    size: int = PAGE_SIZE,
) -> Page:
    """Return the page just older than `after` (or just newer than `before`; else the newest).

    Keyset, never OFFSET: the database starts at the cursor in an index of (…, created_at, id),
    so the 500th page costs what the first does. The condition is written as `created_at <= c
    AND (created_at < c OR id < pk)` so that its first half bounds the index range.
    """
    older_than = Cursor.decode(after) if after else None
    newer_than = Cursor.decode(before) if before else None
    if newer_than is not None:
        c = newer_than
        rows = records.filter(
            Q(created_at__gte=c.created_at),
            Q(created_at__gt=c.created_at) | Q(id__gt=c.id),
        ).order_by("created_at", "id")
        found = list(rows[: size + 1])
        more_newer = len(found) > size
        found = found[:size][::-1]
        return Page(
            records=found,
            number=max(1, number),
            older=Cursor.of(found[-1]).encode() if found else None,
            newer=Cursor.of(found[0]).encode() if found and more_newer else None,
        )
    if older_than is not None:
        c = older_than
        records = records.filter(
            Q(created_at__lte=c.created_at),
            Q(created_at__lt=c.created_at) | Q(id__lt=c.id),
        )
    found = list(records.order_by("-created_at", "-id")[: size + 1])
    more_older = len(found) > size
    found = found[:size]
    return Page(
        records=found,
        number=number if older_than is not None else 1,
        older=Cursor.of(found[-1]).encode() if found and more_older else None,
        newer=Cursor.of(found[0]).encode() if found and older_than is not None else None,
    )


# -- a record's decisions, laid out --------------------------------------------------------------


@dataclass(frozen=True)
class AttemptView:
    """One attempt of a request: where it went, how it ended, and the decision that sent it."""

    number: int
    attempt: dict[str, Any]
    decision: dict[str, Any] | None  # None: not kept (a record from before decisions per attempt)


def attempt_views(record: RoutingRecord) -> list[AttemptView]:
    """Return each attempt with the decision that chose its target.

    A retried record keeps every attempt's decision (`decision["per_attempt"]`); a record of one
    attempt keeps one decision, which is that attempt's.
    """
    decision = record.decision or {}
    per_attempt = decision.get("per_attempt")
    attempts = record.attempts or []
    views = []
    for index, attempt in enumerate(attempts):
        if per_attempt is not None:
            chosen = per_attempt[index] if index < len(per_attempt) else None
        else:
            last = index == len(attempts) - 1
            chosen = decision if last and decision.get("ranking") is not None else None
        views.append(AttemptView(index + 1, attempt, chosen))
    return views


def factor_text(value: float) -> str:
    """Return a factor's value as a person reads it: a score term, not a quantity with a unit."""
    return f"{value:.4g}"


def decision_rows(decision: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the decision's ranking as table rows: place, name, score and each factor."""
    return [
        {
            "place": place,
            "chosen": ranked["target_id"] == decision.get("target_id"),
            "name": ranked["name"],
            "score": factor_text(ranked["score"]),
            "factors": [
                {"name": f["name"], "value": factor_text(f["value"]), "note": f.get("note", "")}
                for f in ranked["factors"]
            ],
        }
        for place, ranked in enumerate(decision.get("ranking", []), start=1)
    ]


def why(record: RoutingRecord) -> str:
    """Return in a few words why the request went where it did, for the Live page's stream."""
    decision = record.decision or {}
    ranking = decision.get("ranking") or []
    if record.target_id is None and not record.target_name:
        return record.get_outcome_display()
    parts = []
    if record.attempt_count > 1:
        parts.append(f"retry after {record.attempt_count - 1} failed")
    continuity = decision.get("continuity", "none")
    if continuity == "kept":
        parts.append("same conversation")
    elif continuity.startswith("yielded"):
        parts.append("conversation moved")
    if len(ranking) > 1:
        parts.append(f"best of {len(ranking)}")
    elif len(ranking) == 1:
        parts.append("only candidate")
    return ", ".join(parts) or "chosen"
