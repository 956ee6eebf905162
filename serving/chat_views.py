"""The LLM chat test page, mounted under /chat/: the page, and its own tokens."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from nexus.auth import acting_user
from serving import chat

SECTION = "chat"


@require_GET
@login_required
def chat_page(request: HttpRequest) -> HttpResponse:
    """Render the chat page; ?service=<pk> or ?pool=<slug> preselects what it talks to."""
    targets = chat.chat_targets(request.user)
    wanted = ""
    if request.GET.get("service"):
        wanted = f"service:{request.GET['service']}"
    elif request.GET.get("pool"):
        wanted = f"pool:{request.GET['pool']}"
    chosen = next((t for t in targets if t.value == wanted), targets[0] if targets else None)
    context = {
        "section": SECTION,
        "targets": targets,
        "chosen": chosen,
        "services": [t for t in targets if t.kind == "service"],
        "pools": [t for t in targets if t.kind == "pool"],
    }
    return render(request, "serving/chat.html", context)


@require_POST
@login_required
def chat_token(request: HttpRequest) -> HttpResponse:
    """Issue the page a token for one pool or service: JSON with its secret, expiry and the URL
    that revokes it."""
    target = chat.find_target(request.user, request.POST.get("target", ""))
    user = acting_user(request)
    if target is None or user is None:
        return JsonResponse({"error": "No such pool or service."}, status=404)
    try:
        token, secret = chat.issue_chat_token(user, target)
    except PermissionError as refused:
        return JsonResponse({"error": str(refused)}, status=403)
    assert token.expires_at is not None
    return JsonResponse(
        {
            "id": token.pk,
            "token": secret,
            "expires_at": token.expires_at.isoformat(),
            "revoke_url": reverse("chat:token_revoke", args=[token.pk]),
        },
        status=201,
    )


@require_POST
@login_required
def chat_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    """Revoke one of the page's tokens (sent by the page as it closes)."""
    user = acting_user(request)
    revoked = user is not None and chat.revoke_chat_token(user, token_id)
    return HttpResponse(status=204 if revoked else 404)
