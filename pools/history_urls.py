"""The History pages' routes, mounted at /history/."""

from __future__ import annotations

from django.urls import path

from pools import history_views

app_name = "history"

urlpatterns = [
    path("", history_views.history_list, name="list"),
    path("<str:request_id>/", history_views.history_detail, name="detail"),
]
