"""Admin API representations of model folders and their files."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from serving import folders
from serving.models import (
    FOLDER_NAME_HELP,
    FOLDER_NAME_MAX_LENGTH,
    ModelFolder,
    validate_folder_name,
)


class ModelFolderSerializer(serializers.ModelSerializer):
    """A model folder: who owns it, where it lives, and which definition files it holds."""

    # Declared, not derived: uniqueness (also ignoring case) is checked where the directory is made.
    name = serializers.CharField(
        max_length=FOLDER_NAME_MAX_LENGTH,
        validators=[validate_folder_name],
        help_text=f"The directory's name; fixed once created. {FOLDER_NAME_HELP}",
    )
    owner = serializers.CharField(
        source="owner.username", read_only=True, allow_null=True, help_text="Who created it."
    )
    path = serializers.CharField(read_only=True, help_text="The directory on the server.")
    model_definition = serializers.CharField(
        source="model_definition_file",
        read_only=True,
        allow_null=True,
        help_text="model-definition.yaml or .yml when the folder holds one, else null.",
    )
    service_definition = serializers.CharField(
        source="service_definition_file",
        read_only=True,
        allow_null=True,
        help_text="service-definition.toml when the folder holds one, else null.",
    )

    class Meta:
        model = ModelFolder
        fields = [
            "name",
            "owner",
            "project",
            "usage",
            "description",
            "path",
            "model_definition",
            "service_definition",
            "created_at",
            "updated_at",
        ]
        # Only model folders exist for now; the field is there for the kinds to come.
        read_only_fields = ["usage"]

    def create(self, validated_data: dict[str, Any]) -> ModelFolder:
        try:
            return folders.create_folder(ModelFolder(**validated_data))
        except folders.FolderExists as taken:
            raise serializers.ValidationError({"name": [str(taken)]}) from None


class FileEntrySerializer(serializers.Serializer):
    """One file in a model folder."""

    path = serializers.CharField(help_text="Relative to the folder, with '/' between parts.")
    size = serializers.IntegerField(help_text="Bytes.")
    modified = serializers.DateTimeField()


class FileListingSerializer(serializers.Serializer):
    """A folder's files, sorted by path."""

    files = FileEntrySerializer(many=True)
    truncated = serializers.BooleanField(
        help_text=f"True when the folder holds more than {folders.MAX_LISTED_FILES} files."
    )


class FilePreviewSerializer(serializers.Serializer):
    """The start of a file: its text when it is UTF-8, null when it is binary."""

    path = serializers.CharField()
    size = serializers.IntegerField(help_text="Bytes, the whole file.")
    modified = serializers.DateTimeField()
    binary = serializers.BooleanField()
    truncated = serializers.BooleanField(
        help_text=f"True when the file is longer than the {folders.PREVIEW_BYTES} bytes shown."
    )
    text = serializers.CharField(allow_null=True)


class UploadSerializer(serializers.Serializer):
    """A multipart upload: one file, and where to put it in the folder."""

    file = serializers.FileField(help_text="The file; it replaces any file at the same path.")
    path = serializers.CharField(
        required=False,
        help_text="Where to store it, relative to the folder (e.g. `weights/model.gguf`); "
        "the uploaded file's name when omitted. Missing directories are created.",
    )
