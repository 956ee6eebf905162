"""Smart Balancer pages: the pools list (live over /ws/pools/) and a pool's detail."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from nexus.pages import HtmxHttpRequest, render_page_or_fragment
from pools.models import Pool

POOL_LIST = "pools/pool_list.html"
POOLS_TABLE = f"{POOL_LIST}#pools-table"


def pools_table_context() -> dict[str, Any]:
    """Return what the pools-table partial needs, for the page and for live pushes alike."""
    pools: QuerySet[Pool] = Pool.objects.prefetch_related("targets")
    return {"pools": pools}


@require_GET
@login_required
def pool_list(request: HtmxHttpRequest) -> HttpResponse:
    """Render the pools page, or only its table for an htmx request."""
    return render_page_or_fragment(request, POOL_LIST, POOLS_TABLE, pools_table_context())


@require_GET
@login_required
def pool_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """Render one pool's settings and targets."""
    pool = get_object_or_404(Pool.objects.prefetch_related("targets"), slug=slug)
    return render(request, "pools/pool_detail.html", {"pool": pool})
