"""Deployments pages, mounted under /deployments/."""

from __future__ import annotations

from django.urls import path

from deployments import views

app_name = "deployments"
urlpatterns = [
    path("", views.deployment_list, name="list"),
    path("new/", views.deployment_create, name="create"),
    path("<int:pk>/", views.deployment_detail, name="detail"),
    path("<int:pk>/retry/", views.deployment_retry, name="retry"),
]
