"""Model serving's stored objects: model folders (directories of model files under the data dir)."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Lower

FOLDER_NAME_MAX_LENGTH = 100
# Starting with a letter or digit rules out ".", "..", hidden names and our own ".nexus-*" files.
FOLDER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
FOLDER_NAME_HELP = "Letters, digits, '-', '_' and '.', starting with a letter or digit."
# Looked for at the folder's top level, in this order (the reference accepts both spellings).
MODEL_DEFINITION_NAMES = ("model-definition.yaml", "model-definition.yml")
SERVICE_DEFINITION_NAME = "service-definition.toml"


def validate_folder_name(name: str) -> None:
    """Refuse a name that is not one safe directory name."""
    if not FOLDER_NAME_RE.fullmatch(name):
        raise ValidationError(f"{name!r} is not a valid folder name: {FOLDER_NAME_HELP}")
    if len(name) > FOLDER_NAME_MAX_LENGTH:
        raise ValidationError(f"A folder name has at most {FOLDER_NAME_MAX_LENGTH} characters.")


def models_root() -> Path:
    """Return the directory that holds every model folder."""
    return Path(settings.DATA_DIR) / "models"


class FolderUsage(models.TextChoices):
    """What a folder is for; only model folders exist now, the value is kept for later kinds."""

    MODEL = "model", "Model"


class ModelFolder(models.Model):
    """A directory of model files, `$NEXUS_DATA_DIR/models/<name>`, that services mount."""

    name = models.CharField(
        max_length=FOLDER_NAME_MAX_LENGTH,
        unique=True,
        validators=[validate_folder_name],
        help_text=f"The directory's name; fixed once created. {FOLDER_NAME_HELP}",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        # The files outlive the person who uploaded them.
        on_delete=models.SET_NULL,
        related_name="model_folders",
    )
    project = models.CharField(max_length=100, default="default")
    usage = models.CharField(max_length=16, choices=FolderUsage.choices, default=FolderUsage.MODEL)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            # "Llama" and "llama" would be one directory on a case-insensitive file system.
            models.UniqueConstraint(
                Lower("name"),
                name="serving_modelfolder_name_ci_unique",
                violation_error_message="A model folder of this name, ignoring case, exists.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def path(self) -> Path:
        """Return the folder's directory; refuse a stored name that could point elsewhere."""
        validate_folder_name(self.name)
        return models_root() / self.name

    @property
    def model_definition_file(self) -> str | None:
        """Return the name of the folder's model definition file, if it has one."""
        return next((n for n in MODEL_DEFINITION_NAMES if (self.path / n).is_file()), None)

    @property
    def service_definition_file(self) -> str | None:
        """Return the name of the folder's service definition file, if it has one."""
        return SERVICE_DEFINITION_NAME if (self.path / SERVICE_DEFINITION_NAME).is_file() else None
