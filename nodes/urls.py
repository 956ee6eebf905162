"""Nodes pages, mounted under /nodes/."""

from __future__ import annotations

from django.urls import path

from nodes import views

app_name = "nodes"
urlpatterns = [
    path("", views.node_list, name="list"),
]
