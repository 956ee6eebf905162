"""Admin API routes of model serving, mounted under /api/v1/."""

from __future__ import annotations

from django.urls import path, re_path
from rest_framework.routers import DefaultRouter

from serving.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
# Folder names hold dots ("llama-3.1-8b"): no `.json` format suffixes to mistake them for.
router.include_format_suffixes = False
router.register("model-folders", views.ModelFolderViewSet, basename="model-folder")

urlpatterns = [
    *router.urls,
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
]
