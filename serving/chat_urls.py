"""The LLM chat test page, mounted under /chat/."""

from __future__ import annotations

from django.urls import path

from serving import chat_views

app_name = "chat"
urlpatterns = [
    path("", chat_views.chat_page, name="page"),
    path("tokens/", chat_views.chat_token, name="token"),
    path("tokens/<int:token_id>/revoke/", chat_views.chat_token_revoke, name="token_revoke"),
]
