"""The LLM chat test page's server side: what a user may chat with, and the page's own tokens.

The conversation never reaches this module: the browser talks to the gateway itself
(/v1/chat/completions, streamed). For a pool or a private service the page asks for a token of
its own, scoped to that one pool or service, expiring within the hour, revoked when the page
closes (docs/chat.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from nexus import access
from nexus.models import ApiToken
from pools.models import Pool
from serving import tokens
from serving.models import Service, ServiceLifecycle

# The longest a chat token lives; the page asks for another when the conversation goes on.
CHAT_TOKEN_TTL = timedelta(hours=1)
# Every chat token's name starts so: the page may revoke only its user's chat tokens.
CHAT_TOKEN_PREFIX = "chat page"


@dataclass(frozen=True)
class ChatTarget:
    """Something the chat page can talk to: an ordinary pool or a service."""

    kind: str  # "pool" or "service"
    key: str  # the pool's slug or the service's pk, as the page's URL names it
    label: str
    project: str
    # Where the browser sends chats (relative to this server) and the model it names there.
    base_path: str
    model: str
    # A public service takes anyone; the others need a token the page issues itself.
    needs_token: bool
    # A service scaled to zero: the first message wakes it, and its reply waits for a replica.
    asleep: bool = False

    @property
    def value(self) -> str:
        """Return the target as one form value: "pool:chat" or "service:12"."""
        return f"{self.kind}:{self.key}"


def _pool_target(pool: Pool) -> ChatTarget:
    return ChatTarget("pool", pool.slug, pool.name, pool.project.name, "/v1", pool.model_name, True)


def _service_target(service: Service) -> ChatTarget:
    asleep = service.scale_to_zero_after_s is not None and service.desired_replicas == 0
    if service.open_to_public:
        # /serve/ passes the request on as it came: the model is the one the replicas serve.
        latest = service.latest_revision
        model = str(latest.spec.get("model_name", "")) if latest is not None else ""
        return ChatTarget(
            "service",
            str(service.pk),
            service.name,
            service.project,
            f"/serve/{service.name}/v1",
            model,
            False,
            asleep,
        )
    return ChatTarget(
        "service",
        str(service.pk),
        service.name,
        service.project,
        "/v1",
        f"@pool/{service.name}",
        True,
        asleep,
    )


def chat_targets(user: Any) -> list[ChatTarget]:
    """Return the ordinary pools and live services the user sees, services first."""
    services = access.in_visible_projects(
        user, Service.objects.filter(lifecycle=ServiceLifecycle.ACTIVE)
    ).select_related("latest_revision")
    pools = Pool.objects.filter(managed=False).select_related("project")
    if not access.is_staff(user):
        pools = pools.filter(project__in=access.visible_projects(user))
    return [*map(_service_target, services), *map(_pool_target, pools)]


def find_target(user: Any, value: str) -> ChatTarget | None:
    """Return the target a form value ("pool:chat", "service:12") names, if the user sees it."""
    return next((t for t in chat_targets(user) if t.value == value), None)


def issue_chat_token(user: User, target: ChatTarget) -> tuple[ApiToken, str]:
    """Issue a token for the target alone, expiring within the hour; return it and its secret.

    Raise PermissionError when the user's role in the target's project only reads it.
    """
    if not access.may_change(user, target.project):
        raise PermissionError("Your role in this project lets you read it, not call it.")
    expires_at = timezone.now() + CHAT_TOKEN_TTL
    name = f"{CHAT_TOKEN_PREFIX} ({user.get_username()})"
    if target.kind == "service":
        service = Service.objects.get(pk=int(target.key))
        return tokens.issue_service_token(
            service, name=name, expires_at=expires_at, created_by=user
        )
    pool = Pool.objects.select_related("project").get(slug=target.key)
    return ApiToken.issue(
        name, project=pool.project, pools=[pool.slug], expires_at=expires_at, created_by=user
    )


def revoke_chat_token(user: User, token_id: int) -> bool:
    """Revoke one of the user's chat tokens; return whether there was one to revoke."""
    token = ApiToken.objects.filter(
        pk=token_id, created_by=user, name__startswith=CHAT_TOKEN_PREFIX, revoked_at=None
    ).first()
    if token is None:
        return False
    token.revoke()
    return True
