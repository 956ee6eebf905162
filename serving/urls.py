"""Model serving pages, mounted under /serving/."""

from __future__ import annotations

from django.urls import path

from serving import autoscaling_views, views

app_name = "serving"
urlpatterns = [
    path("models/", views.model_folder_list, name="model_folder_list"),
    path("models/<str:name>/", views.model_folder_detail, name="model_folder_detail"),
    path("models/<str:name>/upload/", views.model_folder_upload, name="model_folder_upload"),
    path("models/<str:name>/delete/", views.model_folder_delete, name="model_folder_delete"),
    path("models/<str:name>/delete-file/", views.model_file_delete, name="model_file_delete"),
    path("models/<str:name>/files/<path:path>", views.model_file, name="model_file"),
    # Agents fetch model folders here with a signed token (serving.folder_sync); no session.
    path("folder-sync/<str:token>/<path:path>", views.folder_sync_file, name="folder_sync_file"),
    path("resource-groups/", views.resource_group_list, name="resource_group_list"),
    path("resource-groups/<slug:name>/", views.resource_group_edit, name="resource_group_edit"),
    path(
        "resource-groups/<slug:name>/delete/",
        views.resource_group_delete,
        name="resource_group_delete",
    ),
    path("services/", views.service_list, name="service_list"),
    # Before <slug:name>: "new", "check" and "fields" are never service pages.
    path("services/new/", views.service_new, name="service_new"),
    path("services/new/check/", views.service_check, name="service_check"),
    path("services/new/fields/", views.service_variant_fields, name="service_variant_fields"),
    path("services/new/validate/", views.service_validate, name="service_validate"),
    path("services/<slug:name>/", views.service_detail, name="service_detail"),
    path("services/<slug:name>/scale/", views.service_scale, name="service_scale"),
    path("services/<slug:name>/delete/", views.service_delete, name="service_delete"),
    path("services/<slug:name>/edit/", views.service_edit, name="service_edit"),
    path("services/<slug:name>/tokens/", views.service_token_issue, name="service_token_issue"),
    path(
        "services/<slug:name>/tokens/<int:token_id>/revoke/",
        views.service_token_revoke,
        name="service_token_revoke",
    ),
    path(
        "services/<slug:name>/routes/<int:route_id>/",
        views.route_detail,
        name="route_detail",
    ),
    path(
        "services/<slug:name>/autoscaling/rules/",
        autoscaling_views.autoscaling_rules,
        name="autoscaling_rules",
    ),
    path(
        "services/<slug:name>/autoscaling/scale-to-zero/",
        autoscaling_views.scale_to_zero_setting,
        name="scale_to_zero_setting",
    ),
    path(
        "services/<slug:name>/autoscaling/rules/new/",
        autoscaling_views.autoscaling_rule_new,
        name="autoscaling_rule_new",
    ),
    path(
        "services/<slug:name>/autoscaling/rules/<int:rule_id>/edit/",
        autoscaling_views.autoscaling_rule_edit,
        name="autoscaling_rule_edit",
    ),
    path(
        "services/<slug:name>/autoscaling/rules/<int:rule_id>/delete/",
        autoscaling_views.autoscaling_rule_delete,
        name="autoscaling_rule_delete",
    ),
    path(
        "services/<slug:name>/autoscaling/preview/",
        autoscaling_views.autoscaling_preview,
        name="autoscaling_preview",
    ),
    path(
        "services/<slug:name>/autoscaling/events/",
        autoscaling_views.scale_events,
        name="scale_events",
    ),
    path(
        "services/<slug:name>/routes/<int:route_id>/clear-errors/",
        views.route_clear_errors,
        name="route_clear_errors",
    ),
]
