"""Django admin for tokens (secrets shown once, on issue), projects with their members, and the
configuration version."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from nexus import scopes
from nexus.auth import acting_user
from nexus.models import LIMIT_FIELDS, ApiToken, ConfigVersion, Membership, Project


class ApiTokenForm(forms.ModelForm):
    pools = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Leave every pool unticked to let a client token call all pools.",
    )

    class Meta:
        model = ApiToken
        fields = [
            "name",
            "kind",
            "access",
            "project",
            "pools",
            "expires_at",
            # A change reaches every gateway with the next snapshot (the limits are config fields).
            "requests_per_minute",
            "tokens_per_minute",
            "max_concurrent",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        slugs = scopes.pool_slugs() | set(self.instance.pools)
        field = cast("forms.ChoiceField", self.fields["pools"])
        field.choices = [(slug, slug) for slug in sorted(slugs)]

    def clean_expires_at(self) -> Any:
        expires_at = self.cleaned_data["expires_at"]
        if self.instance.pk is None and expires_at is not None and expires_at <= timezone.now():
            raise forms.ValidationError("Choose a time in the future.")
        return expires_at

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        pools = sorted(cleaned.get("pools") or [])
        admin = cleaned.get("kind") == scopes.TokenKind.ADMIN
        if admin and pools:
            self.add_error("pools", "An admin token names no pool.")
        if not admin and cleaned.get("access"):
            self.add_error("access", "A client token has no admin access.")
        if admin and any(cleaned.get(name) is not None for name in LIMIT_FIELDS):
            self.add_error(None, "Limits apply to client tokens: an admin token has none.")
        cleaned["pools"] = pools
        self.instance.all_pools = not admin and not pools
        return cleaned


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    form = ApiTokenForm
    list_display = [
        "name",
        "kind",
        "project",
        "prefix",
        "scope",
        "state",
        "expires_at",
        "last_used_at",
        "created_by",
        "created_at",
    ]
    list_filter = [
        "kind",
        "project",
        "all_pools",
        ("revoked_at", admin.EmptyFieldListFilter),
        "expires_at",
    ]
    search_fields = ["name", "prefix"]
    list_select_related = ["created_by", "project"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        if obj is None:
            return []
        return ["kind", "prefix", "created_by", "created_at", "last_used_at", "revoked_at"]

    @admin.display(description="Scope")
    def scope(self, token: ApiToken) -> str:
        if token.kind == scopes.TokenKind.ADMIN:
            return f"admin API ({token.access})"
        return "all pools" if token.all_pools else ", ".join([*token.pools, *token.services])

    @admin.display(description="State")
    def state(self, token: ApiToken) -> str:
        if token.is_revoked:
            return "revoked"
        return "expired" if token.is_expired else "active"

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        tokens = list(queryset.filter(revoked_at__isnull=True))
        for token in tokens:
            token.revoke()
        self.message_user(request, f"Revoked {len(tokens)} token(s).", messages.SUCCESS)

    def save_form(self, request: HttpRequest, form: forms.ModelForm, change: bool) -> ApiToken:
        if change:
            return super().save_form(request, form, change)
        # Issue through the model so the secret is made and hashed in one place, then shown once.
        data = form.cleaned_data
        token, secret = ApiToken.issue(
            data["name"],
            kind=scopes.TokenKind(data["kind"]),
            access=scopes.AdminAccess(data["access"]) if data.get("access") else None,
            project=data.get("project"),
            pools=data["pools"],
            expires_at=data["expires_at"],
            created_by=acting_user(request),
        )
        self.message_user(
            request,
            format_html(
                "Copy the new token now, it will not be shown again: <code>{}</code>", secret
            ),
            messages.WARNING,
        )
        return token

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        if change:
            super().save_related(request, form, formsets, change)


@admin.register(ConfigVersion)
class ConfigVersionAdmin(admin.ModelAdmin):
    list_display = ["id", "version"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "description", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline]

    def get_readonly_fields(self, request: HttpRequest, obj: Project | None = None) -> list[str]:
        return ["name"] if obj is not None else []
