"""The left navigation in the products' own words (UI.md, "Layout").

An area whose page does not exist yet has no URL name: it shows as "soon", not as a link. The
page that builds it gives it its URL name here, and the navigation links it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    """One entry: its label, the URL it opens, and the views that count as being on it."""

    label: str
    url_name: str = ""  # empty: the area does not exist yet
    # Views whose name (namespace:name) starts with one of these mark the item as current;
    # by default every view of the URL's namespace.
    current_when: tuple[str, ...] = ()

    def is_current(self, view_name: str) -> bool:
        """Say whether the view being shown belongs to this item."""
        if not self.url_name or not view_name:
            return False
        prefixes = self.current_when or (self.url_name.partition(":")[0] + ":",)
        return view_name.startswith(prefixes)


NAVIGATION: tuple[tuple[str, tuple[Item, ...]], ...] = (
    (
        "Smart Balancer",
        (
            Item("Pools", "pools:list"),
            Item("Nodes", "nodes:list"),
            Item("Deployments", "deployments:list"),
            Item("Live", "live:overview"),
            Item("History", "history:list"),
        ),
    ),
    (
        "Serving",
        (
            Item(
                "Services",
                "serving:service_list",
                # A service's own pages: its routes, autoscaling rules and scale events.
                ("serving:service", "serving:route", "serving:autoscaling", "serving:scale"),
            ),
            Item("Model store", "store:list"),
            Item("Model folders", "serving:model_folder_list", ("serving:model_",)),
            Item("Resource groups", "serving:resource_group_list", ("serving:resource_group",)),
            Item("Chat", "chat:page"),
        ),
    ),
    ("Access", (Item("Tokens", "tokens:list"), Item("Projects"))),
)
