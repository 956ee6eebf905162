"""Issue, list and revoke tokens from the shell; `create` prints only the secret."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from nexus import scopes
from nexus.models import DEFAULT_PROJECT, ApiToken, project_named


def parse_expiry(value: str) -> datetime:
    """Return the end of the given day (YYYY-MM-DD) in Nexus's time zone."""
    try:
        day = date.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--expires {value!r} is not a date (YYYY-MM-DD).") from None
    if day < timezone.localdate():
        raise CommandError(f"--expires {value} is in the past.")
    midnight = datetime.combine(day + timedelta(days=1), time.min)
    return timezone.make_aware(midnight)


def describe(token: ApiToken) -> tuple[str, ...]:
    """Return the token's row in `list`: everything but the secret."""
    if token.kind == scopes.TokenKind.ADMIN:
        scope = f"admin {token.access}"
    else:
        scope = "all pools" if token.all_pools else ",".join([*token.pools, *token.services])
    return (
        str(token.pk),
        token.name,
        token.kind,
        token.project.name if token.project else "-",
        token.prefix,
        scope,
        token.expires_at.isoformat(timespec="minutes") if token.expires_at else "never",
        token.last_used_at.isoformat(timespec="minutes") if token.last_used_at else "-",
        "revoked" if token.is_revoked else "expired" if token.is_expired else "active",
    )


class Command(BaseCommand):
    help = "Issue, list and revoke tokens: client tokens call inference, admin tokens the API."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="Issue a token and print only its secret.")
        create.add_argument("--name", required=True)
        create.add_argument(
            "--kind",
            choices=[kind.value for kind in scopes.TokenKind],
            default=scopes.TokenKind.CLIENT.value,
            help="client (default): calls /v1 and /serve; admin: calls the admin API.",
        )
        create.add_argument(
            "--scope",
            choices=[access.value for access in scopes.AdminAccess],
            help="An admin token's access: read (default) or write.",
        )
        create.add_argument(
            "--user",
            metavar="USERNAME",
            help="Who issues it; an admin token acts with this user's rights (required for one).",
        )
        create.add_argument(
            "--project", default=DEFAULT_PROJECT, help="The project the token belongs to."
        )
        create.add_argument(
            "--pool",
            dest="pools",
            action="append",
            default=[],
            metavar="SLUG",
            help="A pool a client token may call (repeat for several); all pools when omitted.",
        )
        create.add_argument(
            "--expires", metavar="YYYY-MM-DD", help="The last day the token works (inclusive)."
        )
        actions.add_parser("list", help="List tokens, without their secrets.")
        revoke = actions.add_parser("revoke", help="Revoke a token.")
        revoke.add_argument("token", metavar="PREFIX_OR_ID")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "create":
            self.create(options)
        elif action == "list":
            self.list_tokens()
        else:
            self.revoke(options["token"])

    def create(self, options: dict[str, Any]) -> None:
        """Issue a token and write only its secret, so that scripts can capture it."""
        kind, pools = scopes.TokenKind(options["kind"]), options["pools"]
        admin = kind == scopes.TokenKind.ADMIN
        if admin and pools:
            raise CommandError("An admin token names no pool (--pool is for client tokens).")
        if not admin and options["scope"]:
            raise CommandError("--scope is for admin tokens (--kind admin).")
        if admin and not options["user"]:
            raise CommandError("An admin token acts as a user: name them with --user.")
        if unknown := scopes.unknown_pool_slugs(pools):
            raise CommandError(f"No pool has the slug {', '.join(unknown)}.")
        user = None
        if options["user"]:
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"No user is named {options['user']!r}.")
        project = project_named(options["project"])
        if project is None:
            raise CommandError(f"No project is named {options['project']!r}.")
        expires = options["expires"]
        _, secret = ApiToken.issue(
            options["name"],
            kind=kind,
            access=scopes.AdminAccess(options["scope"]) if options["scope"] else None,
            project=project,
            pools=pools,
            expires_at=parse_expiry(expires) if expires else None,
            created_by=user,
        )
        self.stdout.write(secret)

    def list_tokens(self) -> None:
        """Write a table of tokens: scope and state, never secrets."""
        header = (
            "ID", "NAME", "KIND", "PROJECT", "PREFIX", "SCOPE", "EXPIRES", "LAST USED", "STATE"
        )  # fmt: skip
        rows = [header, *(describe(token) for token in ApiToken.objects.select_related("project"))]
        widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
        for row in rows:
            cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            self.stdout.write("  ".join(cells).rstrip())

    def revoke(self, key: str) -> None:
        """Revoke the token with this id, or the one whose prefix starts with key."""
        tokens = ApiToken.objects.all()
        matches = list(
            tokens.filter(pk=key) if key.isdigit() else tokens.filter(prefix__startswith=key)
        )
        if not matches:
            raise CommandError(f"No token matches {key!r}.")
        if len(matches) > 1:
            prefixes = ", ".join(token.prefix for token in matches)
            raise CommandError(f"{key!r} matches several tokens ({prefixes}); say more.")
        token = matches[0]
        if token.is_revoked:
            self.stdout.write(f"Token {token.pk} ({token.prefix}) was already revoked.")
            return
        token.revoke()
        self.stdout.write(f"Revoked token {token.pk} ({token.prefix}).")
