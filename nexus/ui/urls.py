"""The console kit's style guide, mounted under /ui/."""

from __future__ import annotations

from django.urls import path

from nexus.ui import views

app_name = "ui"
urlpatterns = [
    path("kit/", views.kit, name="kit"),
    path("kit/confirm/", views.kit_confirm, name="kit_confirm"),
    path("kit/push/", views.kit_push, name="kit_push"),
]
