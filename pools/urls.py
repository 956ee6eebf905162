"""Smart Balancer pages, mounted under /pools/."""

from __future__ import annotations

from django.urls import path

from pools import pool_views, views, wizard_views

app_name = "pools"
urlpatterns = [
    path("", views.pool_list, name="list"),
    # The create-pool wizard: /pools/new/ starts a draft (pools.wizard_views).
    path("new/", wizard_views.wizard_start, name="new"),
    path("new/<str:draft_id>/nodes/add/", wizard_views.wizard_node_add, name="wizard_node_add"),
    path(
        "new/<str:draft_id>/nodes/confirm/",
        wizard_views.wizard_node_confirm,
        name="wizard_node_confirm",
    ),
    path(
        "new/<str:draft_id>/targets/add/", wizard_views.wizard_target_add, name="wizard_target_add"
    ),
    path(
        "new/<str:draft_id>/targets/<int:index>/remove/",
        wizard_views.wizard_target_remove,
        name="wizard_target_remove",
    ),
    path("new/<str:draft_id>/validate/", wizard_views.wizard_validate, name="wizard_validate"),
    path("new/<str:draft_id>/dry-run/", wizard_views.wizard_dry_run, name="wizard_dry_run"),
    path("new/<str:draft_id>/<slug:step>/", wizard_views.wizard_step, name="wizard"),
    path("<slug:slug>/", pool_views.pool_detail, name="detail"),
    path("<slug:slug>/created/", wizard_views.pool_created, name="created"),
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
