"""How many examples a property test tries: all of them in `make test`, a fifth in the fast loop.

`make test-fast` sets `NEXUS_TEST_QUICK_PROPERTIES=1`: the loop while you work stays under a
minute, and `make test` (CI) still tries every example each test asks for. Hypothesis's own
profiles cannot do this: a test's `@settings(max_examples=...)` overrides any profile.
"""

from __future__ import annotations

import os

QUICK = os.environ.get("NEXUS_TEST_QUICK_PROPERTIES", "") not in ("", "0")
# Fewer than this finds too little to be worth running at all.
QUICK_FLOOR = 20


def examples(count: int) -> int:
    """Return the examples to try: `count`, or a fifth of it (at least 20) in the fast loop."""
    if not QUICK:
        return count
    return min(count, max(QUICK_FLOOR, count // 5))
