"""Django admin for model folders: adding or deleting one makes or removes its directory."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from serving import folders
from serving.models import ModelFolder


class ModelFolderAdminForm(forms.ModelForm):
    class Meta:
        model = ModelFolder
        fields = ["name", "owner", "project", "description"]

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if self.instance.pk is None:
            try:
                folders.check_name_free(name)
            except folders.FolderExists as taken:
                raise forms.ValidationError(str(taken)) from None
        return name


@admin.register(ModelFolder)
class ModelFolderAdmin(admin.ModelAdmin):
    form = ModelFolderAdminForm
    list_display = ["name", "project", "usage", "owner", "created_at"]
    list_filter = ["project", "usage"]
    search_fields = ["name", "description"]
    readonly_fields = ["usage", "directory", "created_at", "updated_at"]

    @admin.display(description="Directory")
    def directory(self, folder: ModelFolder) -> str:
        return str(folder.path) if folder.pk else "—"

    def get_readonly_fields(self, request: HttpRequest, obj: ModelFolder | None = None) -> Any:
        # The name is the directory's name: renaming the row would lose the files.
        fields = super().get_readonly_fields(request, obj)
        return [*fields, "name"] if obj is not None else fields

    def save_model(
        self, request: HttpRequest, obj: ModelFolder, form: forms.ModelForm, change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
        else:
            obj.owner = obj.owner or request.user
            folders.create_folder(obj)

    def delete_model(self, request: HttpRequest, obj: ModelFolder) -> None:
        folders.delete_folder(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ModelFolder]) -> None:
        for folder in queryset:
            folders.delete_folder(folder)
