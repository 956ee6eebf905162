"""`manage.py nexus_token`: scripts capture the secret from stdout; mistakes fail loudly."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from nexus.models import ApiToken, hash_token
from tests.nexus.factories import make_pool, make_user
from tests.support.live import REPO_ROOT, server_environment
from tests.support.personas import bearer


def nexus_token(*args: str) -> tuple[str, str]:
    """Run the command and return what it wrote to stdout and stderr."""
    out, err = StringIO(), StringIO()
    call_command("nexus_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_create_prints_only_the_secret() -> None:
    make_pool("chat")
    make_pool("embed")

    out, err = nexus_token("create", "--name", "ci", "--pool", "chat", "--pool", "embed")

    token = ApiToken.objects.get()
    assert out == f"{out.strip()}\n"
    assert token.token_hash == hash_token(out.strip())
    assert err == ""
    assert (token.name, token.all_pools, token.pools) == ("ci", False, ["chat", "embed"])


@pytest.mark.django_db
def test_create_without_pools_covers_all_pools() -> None:
    nexus_token("create", "--name", "ci")

    assert ApiToken.objects.get().all_pools is True


@pytest.mark.django_db
def test_create_issues_an_admin_token_that_acts_as_its_user() -> None:
    make_user("ops", staff=True)

    out, _ = nexus_token(
        "create", "--name", "ci", "--kind", "admin", "--scope", "write", "--user", "ops"
    )

    token = ApiToken.objects.get()
    assert token.token_hash == hash_token(out.strip())
    assert (token.kind, token.access, token.all_pools, token.created_by.username) == (
        "admin",
        "write",
        False,
        "ops",
    )
    assert bearer(out.strip()).patch("/api/v1/pools/nope/", {}).status_code == 404


@pytest.mark.django_db
def test_an_expiry_date_is_the_last_day_the_token_works() -> None:
    day = timezone.localdate() + timedelta(days=30)

    nexus_token("create", "--name", "ci", "--expires", day.isoformat())

    expires_at = timezone.localtime(ApiToken.objects.get().expires_at)
    assert (expires_at.date(), expires_at.time().isoformat()) == (
        day + timedelta(days=1),
        "00:00:00",
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pool", "nope"], "No pool has the slug nope."),
        (["--expires", "31/12/2030"], "--expires '31/12/2030' is not a date (YYYY-MM-DD)."),
        (["--expires", "2020-01-01"], "--expires 2020-01-01 is in the past."),
        (["--kind", "admin"], "An admin token acts as a user: name them with --user."),
        (
            ["--kind", "admin", "--pool", "chat"],
            "An admin token names no pool (--pool is for client tokens).",
        ),
        (["--scope", "write"], "--scope is for admin tokens (--kind admin)."),
        (["--kind", "admin", "--user", "nobody"], "No user is named 'nobody'."),
        (["--project", "nope"], "No project is named 'nope'."),
    ],
)
def test_create_refuses_mistakes(args: list[str], message: str) -> None:
    with pytest.raises(CommandError) as error:
        nexus_token("create", "--name", "ci", *args)

    assert str(error.value) == message
    assert ApiToken.objects.count() == 0


@pytest.mark.django_db
def test_list_shows_tokens_without_secrets() -> None:
    make_pool("chat")
    active, secret = ApiToken.issue("ci", pools=["chat"])
    revoked, _ = ApiToken.issue("old")
    revoked.revoke()

    out, _ = nexus_token("list")

    assert [re.split(r"\s{2,}", line) for line in out.splitlines()] == [
        ["ID", "NAME", "KIND", "PROJECT", "PREFIX", "SCOPE", "EXPIRES", "LAST USED", "STATE"],
        [str(active.pk), "ci", "client", "-", active.prefix, "chat", "never", "-", "active"],
        [
            str(revoked.pk),
            "old",
            "client",
            "-",
            revoked.prefix,
            "all pools",
            "never",
            "-",
            "revoked",
        ],
    ]
    assert secret not in out


@pytest.mark.django_db
@pytest.mark.parametrize("by", ["prefix", "id"])
def test_revoke_finds_the_token_by_prefix_or_id(by: str) -> None:
    token, _ = ApiToken.issue("ci")

    out, _ = nexus_token("revoke", token.prefix if by == "prefix" else str(token.pk))

    token.refresh_from_db()
    assert token.is_revoked
    assert out == f"Revoked token {token.pk} ({token.prefix}).\n"


@pytest.mark.django_db
def test_revoke_refuses_an_unknown_token() -> None:
    with pytest.raises(CommandError, match=r"^No token matches 'nx-nope'\.$"):
        nexus_token("revoke", "nx-nope")


@pytest.mark.django_db
def test_revoke_refuses_an_ambiguous_prefix() -> None:
    ApiToken.issue("a")
    ApiToken.issue("b")

    with pytest.raises(CommandError, match=r"^'nx-' matches several tokens"):
        nexus_token("revoke", "nx-")

    assert ApiToken.objects.usable().count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_script_captures_the_secret_and_sees_errors_on_stderr() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", "nexus_token", "create", "--name", "ci", *args],
            cwd=REPO_ROOT,
            env=server_environment(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    made = run()
    refused = run("--pool", "nope")

    assert made.returncode == 0
    assert made.stdout.count("\n") == 1
    assert ApiToken.objects.get().token_hash == hash_token(made.stdout.strip())
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == "CommandError: No pool has the slug nope.\n"
