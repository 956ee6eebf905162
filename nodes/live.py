"""What fleet changes push to the open nodes pages (nexus.live has the pattern).

The table is pushed after every refresh round, so that each node's status, reason and last-seen
time on the page are the ones just read (nexus.js keeps "12 s ago" ageing in between).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import transaction
from django.db.models import Count, QuerySet

from nexus import live
from nodes.models import Node

NODE_LIST = "nodes/node_list.html"
NODES_TABLE = f"{NODE_LIST}#nodes-table"
NODES_TOPIC = "nodes"
# True inside `one_push()`: saves of single nodes wait for the one push at the end.
_batched: ContextVar[bool] = ContextVar("nodes_live_batched", default=False)


def fleet() -> QuerySet[Node]:
    """Return every node with its model count, for the list."""
    return Node.objects.annotate(model_count=Count("models"))


def nodes_table_context(audience: live.Audience) -> dict[str, Any]:
    """Return what the nodes-table partial needs, for the page and for pushes alike."""
    return {"nodes": fleet(), "can_manage": audience == "manage"}


def nodes_table(audience: live.Audience) -> str:
    """Return the nodes table as it is now, rendered for a push."""
    return live.fragment(NODES_TABLE, nodes_table_context(audience))


def nodes_changed() -> None:
    """Push the current nodes table to every open nodes page."""
    live.push_each_audience(NODES_TOPIC, "nodes-table", nodes_table)


def node_saved() -> None:
    """Push the table once the change commits, unless a batch pushes it at its end."""
    if not _batched.get():
        transaction.on_commit(nodes_changed, robust=True)


@contextmanager
def one_push() -> Iterator[None]:
    """Push the table once, after a block that saves many nodes (a refresh round)."""
    token = _batched.set(True)
    try:
        yield
    finally:
        _batched.reset(token)
        transaction.on_commit(nodes_changed, robust=True)
