"""Deployments pages, mounted under /deployments/."""

from __future__ import annotations

from django.urls import path

from deployments import views

app_name = "deployments"
urlpatterns = [
    path("", views.deployment_list, name="list"),
]
