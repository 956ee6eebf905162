"""The tokens page, shared by both products: list, issue (secret shown once), revoke."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from nexus import access, scopes
from nexus.models import LIMIT_FIELDS, ApiToken
from nexus.ui import badges
from pools import services
from pools.forms import TokenIssueForm
from pools.models import Pool

TOKEN_LIST = "pools/token_list.html"
TOKEN_NEW = "pools/token_new.html"
TOKEN_ISSUED = "pools/token_issued.html"
TOKEN_REVOKE = "pools/token_revoke.html"


def visible_tokens(user: Any) -> QuerySet[ApiToken]:
    """Return the tokens of the user's projects (staff: every token), newest first."""
    tokens = ApiToken.objects.select_related("created_by", "project").order_by("-created_at", "-id")
    if access.is_staff(user):
        return tokens  # those of no project too, which only staff see
    return tokens.filter(project__in=access.visible_projects(user))


def token_state(token: ApiToken) -> str:
    return "revoked" if token.is_revoked else "expired" if token.is_expired else "valid"


def describe_scope(token: ApiToken) -> str:
    """Say what the token reaches: its pools and services, or an admin token's access."""
    if token.kind == scopes.TokenKind.ADMIN:
        return f"admin API, {token.access or 'read'}"
    if token.all_pools:
        return "every pool"
    named = [f"@pool/{slug}" for slug in token.pools]
    named += [f"service {name}" for name in token.services]
    return ", ".join(named)


@require_GET
@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    """List the tokens with their state, limits and usage over the last day and month."""
    tokens = list(visible_tokens(request.user))
    usage = services.token_usage([token.pk for token in tokens], timezone.now())
    changeable = set(access.changeable_projects(request.user).values_list("pk", flat=True))
    rows = [
        {
            "token": token,
            "state": badges.token(token_state(token)),
            "scope": describe_scope(token),
            "limits": services.describe_limits(token),
            "day": usage[token.pk]["day"].describe(),
            "month": usage[token.pk]["month"].describe(),
            "dialog": f"revoke-{token.pk}",
            "can_revoke": token.project_id in changeable or access.is_staff(request.user),
        }
        for token in tokens
    ]
    context = {
        "rows": rows,
        "can_issue": access.changeable_projects(request.user).exists(),
        "can_revoke": any(row["can_revoke"] for row in rows),
        "section": "tokens",
    }
    return render(request, TOKEN_LIST, context)


@require_http_methods(["GET", "POST"])
@login_required
def token_new(request: HttpRequest) -> HttpResponse:
    """Show the form; on a valid post issue the token and show its secret, this once."""
    if not access.changeable_projects(request.user).exists():
        raise PermissionDenied("Only a project's owners and members (or staff) issue tokens.")
    form = TokenIssueForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        admin = data["kind"] == scopes.TokenKind.ADMIN
        token, secret = ApiToken.issue(
            data["name"],
            kind=scopes.TokenKind(data["kind"]),
            access=scopes.AdminAccess(data["access"] or "read") if admin else None,
            project=form.chosen_project(),
            pools=data["pools"],
            services=data["services"],
            expires_at=data["expires_at"],
            created_by=request.user if request.user.is_authenticated else None,
            **{name: data[name] for name in LIMIT_FIELDS},
        )
        # Rendered, not redirected: the secret must not travel through a stored message.
        context = {"token": token, "secret": secret, "model": snippet_model(token)}
        return render(request, TOKEN_ISSUED, {**context, "section": "tokens"})
    status = 400 if form.errors else 200
    return render(request, TOKEN_NEW, {"form": form, "section": "tokens"}, status=status)


def snippet_model(token: ApiToken) -> str:
    """Return the model a client token's snippets call: its first pool or service, or any pool."""
    if token.pools:
        return f"@pool/{token.pools[0]}"
    if token.services:
        return f"@pool/{token.services[0]}"
    slug = Pool.objects.filter(managed=False).order_by("slug").values_list("slug", flat=True)
    return f"@pool/{slug.first() or '<slug>'}"


@require_http_methods(["GET", "POST"])
@login_required
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    """Confirm (GET), then revoke (POST) and go back to the list; a project's members may."""
    token = get_object_or_404(visible_tokens(request.user), pk=pk)
    if not access.may_change(request.user, token.project.name if token.project else None):
        raise PermissionDenied("Only the project's owners and members may revoke its tokens.")
    if request.method == "POST":
        if not token.is_revoked:
            token.revoke()
        messages.success(request, f"Token {token.name} revoked: it is refused from now on.")
        return redirect("tokens:list")
    return render(request, TOKEN_REVOKE, {"token": token, "section": "tokens"})
