"""Forms of the model serving pages."""

from __future__ import annotations

from django import forms

from serving.models import FOLDER_NAME_HELP, FOLDER_NAME_MAX_LENGTH, validate_folder_name


class ModelFolderForm(forms.Form):
    """A new model folder: its name, project and what it is for."""

    name = forms.CharField(
        max_length=FOLDER_NAME_MAX_LENGTH,
        validators=[validate_folder_name],
        help_text=FOLDER_NAME_HELP,
    )
    project = forms.CharField(max_length=100, initial="default")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
