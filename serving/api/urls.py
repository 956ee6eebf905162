"""Admin API routes of model serving, mounted under /api/v1/."""

from __future__ import annotations

from django.urls import path, re_path
from rest_framework.routers import DefaultRouter

from serving.api import autoscaling, tokens, views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
# Folder names hold dots ("llama-3.1-8b"): no `.json` format suffixes to mistake them for.
router.include_format_suffixes = False
router.register("model-folders", views.ModelFolderViewSet, basename="model-folder")
router.register("services", views.ServiceViewSet, basename="service")
router.register(
    r"services/(?P<service_name>[-A-Za-z0-9_]+)/tokens",
    tokens.ServiceTokenViewSet,
    basename="service-token",
)
router.register("trials", views.TrialViewSet, basename="trial")
router.register(
    r"services/(?P<service_name>[-A-Za-z0-9_]+)/autoscaling-rules",
    autoscaling.AutoScalingRuleViewSet,
    basename="autoscaling-rule",
)
router.register(
    r"services/(?P<service_name>[-A-Za-z0-9_]+)/scale-events",
    autoscaling.ScaleEventViewSet,
    basename="scale-event",
)
router.register("resource-groups", views.ResourceGroupViewSet, basename="resource-group")
router.register("resource-presets", views.ResourcePresetViewSet, basename="resource-preset")

urlpatterns = [
    *router.urls,
    path(
        "autoscaling-presets/",
        autoscaling.PresetListView.as_view(),
        name="autoscaling-presets",
    ),
    path(
        "model-folders/<str:name>/files/",
        views.ModelFolderFilesView.as_view(),
        name="model-folder-files",
    ),
    re_path(
        r"^model-folders/(?P<name>[^/]+)/files/(?P<path>.+)$",
        views.ModelFolderFileView.as_view(),
        name="model-folder-file",
    ),
    path(
        "definitions/model-definition.schema.json",
        views.ModelDefinitionSchemaView.as_view(),
        name="model-definition-schema",
    ),
    path(
        "definitions/validate/",
        views.ValidateDefinitionView.as_view(),
        name="definition-validate",
    ),
]
