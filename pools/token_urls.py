"""The tokens page's routes, mounted at /tokens/."""

from __future__ import annotations

from django.urls import path

from pools import token_views

app_name = "tokens"

urlpatterns = [
    path("", token_views.token_list, name="list"),
    path("new/", token_views.token_new, name="new"),
    path("<int:pk>/revoke/", token_views.token_revoke, name="revoke"),
]
