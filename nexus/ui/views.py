"""The staff-only style guide (/ui/kit/): every component and every badge state, live.

It is the reference the page builders look at, and what the kit's browser test drives; its data
are samples, and its actions change nothing but the page.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from nexus import live
from nexus.auth import acting_user
from nexus.models import ApiToken
from nexus.pages import staff_required
from nexus.ui import badges, charts, format

KIT = "ui/kit.html"
KIT_LIVE = f"{KIT}#kit-live"
KIT_TOPIC = "ui-kit"
# Sample charts: the last 15 minutes at one point every 10 s.
SAMPLE_SPAN_S = 15 * 60
SAMPLE_STEP_S = 10


class SampleForm(forms.Form):
    """A form that shows how errors sit next to their fields and values are kept."""

    name = forms.SlugField(max_length=64, help_text="Letters, digits, - and _; e.g. chat.")
    replicas = forms.IntegerField(min_value=1, max_value=64, initial=1)
    strategy = forms.ChoiceField(
        choices=[("smart", "Smart (recommended)"), ("least_busy", "Least busy")],
        widget=forms.RadioSelect,
        initial="smart",
    )
    api_key = forms.CharField(
        label="Provider key",
        widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: never shown again, not even after an error.",
    )

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if name == "taken":
            raise forms.ValidationError("A pool named taken exists.")
        return name


def sample_charts(now: float) -> list[charts.TimeSeries]:
    """Return two charts of made-up traffic, so that the page shows the shared window and cursor."""
    start = math.floor(now / SAMPLE_STEP_S) * SAMPLE_STEP_S - SAMPLE_SPAN_S
    times = [float(start + step) for step in range(0, SAMPLE_SPAN_S + 1, SAMPLE_STEP_S)]
    wave = [math.sin(t / 120) for t in times]
    requests = charts.time_series(
        "kit-requests",
        "Requests",
        "req/s",
        times,
        [("fast", [12 + 4 * w for w in wave]), ("slow", [5 + 2 * w for w in wave])],
    )
    ttft = charts.time_series(
        "kit-ttft",
        "Time to first token, p95",
        "ms",
        times,
        # A gap: no data is drawn as none, never as zero.
        [("p95", [None if 40 <= i < 46 else 180 + 60 * w for i, w in enumerate(wave)])],
        tones=[badges.Tone.WARN],
    )
    return [requests, ttft]


def kit_context(request: HttpRequest, form: SampleForm) -> dict[str, Any]:
    now = timezone.now()
    catalogue = [
        {"kind": kind, "badges": [badges.plain(kind, state) for state in states]}
        for kind, states in badges.CATALOGUE.items()
    ]
    offline_since = now - timedelta(minutes=3)
    examples = [
        badges.target("draining", in_flight=3),
        badges.health("ejected", trial_in_s=12, cause="3 connect errors"),
        badges.health(
            "healthy",
            node_trust="trusted",
            node_status="offline",
            node_since=offline_since,
            node_error="connection refused",
            now=now,
        ),
        badges.deployment("running", phase="downloading", percent=42.0),
        badges.node("trusted", "offline", since=offline_since, error="connection refused", now=now),
        badges.service("active", ready=2, desired=3),
        badges.worst(badges.target("drained"), badges.health("healthy")),
    ]
    numbers = [
        ("duration", "0.038", format.duration(0.038)),
        ("duration", "1.234", format.duration(1.234)),
        ("duration", "185", format.duration(185)),
        ("duration_ms", "1234", format.duration_ms(1234)),
        ('rate:"tok"', "958.3", format.rate(958.3, "tok")),
        ('rate:"req"', "17.2", format.rate(17.2, "req")),
        ("binary_size", "268435456", format.binary_size(268435456)),
        ("binary_size", "1610612736", format.binary_size(1610612736)),
        ('count:"replica"', "1", format.count(1, "replica")),
        ('count:"replica"', "2", format.count(2, "replica")),
        ("percent", "0.312", format.percent(0.312)),
        ("{% ago %}", "3 min before now", format.ago(offline_since, now)),
    ]
    return {
        "form": form,
        "catalogue": catalogue,
        "examples": examples,
        "numbers": numbers,
        "charts": sample_charts(now.timestamp()),
        "share": charts.share_chart(
            "Requests per target", [("fast", 84), ("medium", 41), ("slow", 15)]
        ),
        "tokens": ApiToken.objects.usable().filter(created_by=acting_user(request))[:20],
        "wide_rows": range(3),
        "offline_since": offline_since,
        **kit_live_context(),
    }


def kit_live_context() -> dict[str, Any]:
    return {"rendered_at": timezone.now()}


def kit_live() -> str:
    """Return the kit's live part as it is now, rendered for a push."""
    return live.fragment(KIT_LIVE, kit_live_context())


@require_http_methods(["GET", "POST"])
@staff_required("see the UI kit")
def kit(request: HttpRequest) -> HttpResponse:
    """Render the style guide; a valid sample form redirects with a toast (POST, redirect, GET)."""
    form = SampleForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        messages.success(request, f"Saved the sample {form.cleaned_data['name']} (nothing stored).")
        return redirect("ui:kit")
    status = 400 if form.errors else 200
    return render(request, KIT, kit_context(request, form), status=status)


@require_POST
@staff_required("see the UI kit")
def kit_confirm(request: HttpRequest) -> HttpResponse:
    """Stand in for a destructive action: the confirmation dialog posts here."""
    messages.success(request, "Confirmed: nothing was deleted, this is the UI kit.")
    return redirect("ui:kit")


@require_POST
@staff_required("see the UI kit")
def kit_push(request: HttpRequest) -> HttpResponse:
    """Push the kit's live part to every open kit page, as a save pushes a page's partial."""
    live.push(KIT_TOPIC, "kit-live", kit_live())
    return HttpResponse(status=204)
