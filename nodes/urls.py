"""Nodes pages, mounted under /nodes/."""

from __future__ import annotations

from django.urls import path

from nodes import views

app_name = "nodes"
urlpatterns = [
    path("", views.node_list, name="list"),
    path("add/", views.node_add, name="add"),
    path("<slug:name>/", views.node_detail, name="detail"),
    path("<slug:name>/confirm/", views.node_confirm, name="confirm"),
    path("<slug:name>/reject/", views.node_reject, name="reject"),
    path("<slug:name>/refresh/", views.node_refresh, name="refresh"),
]
