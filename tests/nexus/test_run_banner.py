"""`make run`'s banner says which pool its demo token may call and where to make more tokens."""

from __future__ import annotations

import re

from nexus.management.commands.nexus_run import DEMO_ENGINES, FirstRun, banner


def test_the_first_runs_banner_names_the_demo_tokens_pool_and_the_tokens_page() -> None:
    ports = list(range(9100, 9100 + len(DEMO_ENGINES)))

    text = banner(FirstRun(admin_password="pw", demo_token="nx-secret"), ports, "this machine")

    assert re.search(r"Client token  (nx-\S+)", text).group(1) == "nx-secret"
    assert "calls @pool/demo only (/v1), never the admin API;\n" in text
    assert re.search(r"more tokens, with limits: http://\S+/tokens/", text)
    assert "nexus_token create --name NAME --kind admin \\\n" in text
    assert "--scope write --user admin   (for the admin API: docs/access.md)" in text


def test_a_later_runs_banner_says_where_to_issue_a_token() -> None:
    ports = list(range(9100, 9100 + len(DEMO_ENGINES)))

    text = banner(FirstRun(), ports, "this machine")

    assert re.search(r"Client token  more tokens, with limits: http://\S+/tokens/ \(or ", text)
