"""Smart Balancer pages, mounted under /pools/."""

from __future__ import annotations

from django.urls import path

from pools import pool_views, views

app_name = "pools"
urlpatterns = [
    path("", views.pool_list, name="list"),
    path("new/", pool_views.pool_new, name="new"),
    path("<slug:slug>/", pool_views.pool_detail, name="detail"),
    path("<slug:slug>/settings/", pool_views.pool_settings, name="settings"),
    path("<slug:slug>/dry-run/", pool_views.dry_run, name="dry_run"),
    path("<slug:slug>/validate/", pool_views.validate, name="validate"),
    path("<slug:slug>/try/", pool_views.try_traffic, name="try_traffic"),
    path("<slug:slug>/drill/", pool_views.failure_drill, name="drill"),
    path("<slug:slug>/runs/<int:pk>/", pool_views.run_detail, name="run"),
    path("<slug:slug>/validate/confirm/", pool_views.confirm_identity, name="confirm_identity"),
    path("<slug:slug>/drain/", pool_views.pool_drain, name="drain"),
    path("<slug:slug>/targets/add/", pool_views.target_add, name="target_add"),
    path("<slug:slug>/targets/<int:pk>/", pool_views.target_edit, name="target_edit"),
    path("<slug:slug>/targets/<int:pk>/remove/", pool_views.target_remove, name="target_remove"),
    path("<slug:slug>/resume/", pool_views.pool_resume, name="resume"),
    path("<slug:slug>/targets/<int:pk>/drain/", pool_views.target_drain, name="target_drain"),
    path("<slug:slug>/targets/<int:pk>/resume/", pool_views.target_resume, name="target_resume"),
]
