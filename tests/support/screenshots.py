"""Screenshots of the pages for the README's gallery: `screenshot(page, "pools-list-empty")`.

Every page test saves its page with this at 1280×800, full page, to
docs/screenshots/<area>-<page>-<state>.png, and fails when the page is wider than its window:
a wide table must scroll inside its card instead (UI.md). Look at each one you take.

With `NEXUS_SCREENSHOTS=0` (set by `make test`) the width is checked and no picture is taken: a
run of the suite would otherwise rewrite the whole gallery in the working tree, and the pictures
cost Chromium 3-12 s of CPU a run. `make screenshots` retakes them all.
"""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Page, ViewportSize

from nexus.env import env_bool

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)+")


def screenshot(page: Page, name: str) -> Path:
    """Save the whole page as docs/screenshots/<name>.png at 1280×800 (unless screenshots are
    off) and return its path."""
    if not NAME.fullmatch(name):
        raise ValueError(
            f"{name!r}: name screenshots <area>-<page>-<state>, lowercase, e.g. pools-list-empty"
        )
    page.set_viewport_size(VIEWPORT)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= VIEWPORT["width"], (
        f"{name}: the page is {width} px wide in a {VIEWPORT['width']} px window"
    )
    path = SCREENSHOTS / f"{name}.png"
    if not env_bool("NEXUS_SCREENSHOTS", True):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=path, full_page=True, animations="disabled", caret="hide")
    return path
