"""The History pages: the routing history, filtered and paged, and one request's decisions."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from nexus.pages import HtmxHttpRequest, render_page_or_fragment
from pools import services
from pools.history_pages import (
    HistoryFilterForm,
    attempt_views,
    decision_rows,
    page_of,
)
from pools.models import RoutingRecord
from pools.views import visible_pools

HISTORY_LIST = "pools/history_list.html"
HISTORY_DETAIL = "pools/history_detail.html"


@require_GET
@login_required
def history_list(request: HtmxHttpRequest) -> HttpResponse:
    """Render a page of the history, newest first, narrowed by the filters in the query."""
    form = HistoryFilterForm(request.GET or None, visible_pools(request.user))
    records = form.narrow(RoutingRecord.objects.filter(pool__in=visible_pools(request.user)))
    records = records.select_related("pool")
    number = request.GET.get("page", "1")
    page = page_of(
        records,
        after=request.GET.get("after", ""),
        before=request.GET.get("before", ""),
        number=int(number) if number.isdigit() else 1,
    )
    # The filters travel with the page links; the cursors and the page number are the links'.
    kept = request.GET.copy()
    for name in ("after", "before", "page"):
        kept.pop(name, None)
    context = {"form": form, "page": page, "filters": kept.urlencode()}
    return render_page_or_fragment(request, HISTORY_LIST, f"{HISTORY_LIST}#history-table", context)


@require_GET
@login_required
def history_detail(request: HtmxHttpRequest, request_id: str) -> HttpResponse:
    """Render one request: each attempt with its decision; with ?replay, today's next to it."""
    records = RoutingRecord.objects.filter(pool__in=visible_pools(request.user))
    record = get_object_or_404(records.select_related("pool", "target"), request_id=request_id)
    attempts = [
        {"view": view, "rows": decision_rows(view.decision) if view.decision else []}
        for view in attempt_views(record)
    ]
    context: dict[str, object] = {
        "record": record,
        "attempts": attempts,
        "final": record.decision,
        "final_rows": decision_rows(record.decision) if record.decision.get("ranking") else [],
    }
    if "replay" in request.GET:
        replayed = services.replay(record)
        context["replay"] = {
            **replayed,
            "then_rows": decision_rows(replayed["then"]),
            "now_rows": decision_rows(replayed["now"]),
        }
        return render_page_or_fragment(request, HISTORY_DETAIL, f"{HISTORY_DETAIL}#replay", context)
    return render(request, HISTORY_DETAIL, context)
