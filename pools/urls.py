"""Smart Balancer pages, mounted under /pools/."""

from __future__ import annotations

from django.urls import path

from pools import views

app_name = "pools"
urlpatterns = [
    path("", views.pool_list, name="list"),
    path("<slug:slug>/", views.pool_detail, name="detail"),
]
