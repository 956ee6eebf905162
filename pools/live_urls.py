"""The Live pages' routes, mounted at /live/."""

from __future__ import annotations

from django.urls import path

from pools import live_views

app_name = "live"

urlpatterns = [
    path("", live_views.live_overview, name="overview"),
    path("<slug:slug>/", live_views.live_pool, name="pool"),
]
