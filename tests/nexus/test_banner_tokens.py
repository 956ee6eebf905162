"""make run's banner says what its token may call and where more tokens come from."""

from __future__ import annotations

from nexus.management.commands.nexus_run import DEMO_ENGINES, FirstRun, banner


def test_the_banner_says_the_demo_token_calls_the_demo_pool_only() -> None:
    ports = list(range(9001, 9001 + len(DEMO_ENGINES)))

    text = banner(FirstRun(admin_password="pw", demo_token="nx-demo"), ports, "local")

    assert "Client token  nx-demo  (shown this once: keep it)" in text
    assert "a client token: calls @pool/demo only (/v1), never the admin API" in text
    assert "More tokens   " in text
    assert "manage.py nexus_token create --name NAME --pool SLUG" in text
    assert "--kind admin --scope write --user admin" in text
    assert "/api/v1/tokens/" in text
