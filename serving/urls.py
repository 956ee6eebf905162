"""Model serving pages, mounted under /serving/."""

from __future__ import annotations

from django.urls import path

from serving import views

app_name = "serving"
urlpatterns = [
    path("models/", views.model_folder_list, name="model_folder_list"),
    path("models/<str:name>/", views.model_folder_detail, name="model_folder_detail"),
    path("models/<str:name>/upload/", views.model_folder_upload, name="model_folder_upload"),
    path("models/<str:name>/delete/", views.model_folder_delete, name="model_folder_delete"),
    path("models/<str:name>/delete-file/", views.model_file_delete, name="model_file_delete"),
    path("models/<str:name>/files/<path:path>", views.model_file, name="model_file"),
]
