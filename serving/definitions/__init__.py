"""Model and service definitions: parsing, checking and the published schema (pure Python).

Nothing here imports Django or touches files: callers pass the text they read.
"""

from __future__ import annotations

from .command_import import CommandImportError, ImportedCommand, import_command
from .errors import DefinitionError, Problem
from .model_definition import (
    HealthCheck,
    ModelDefinition,
    ModelSpec,
    PreStartAction,
    ServiceSpec,
    parse_model_definition,
)
from .schema import MODEL_DEFINITION_SCHEMA
from .service_definition import (
    Environment,
    ServiceDefinition,
    VariantDefaults,
    parse_memory,
    parse_service_definition,
)

__all__ = [
    "MODEL_DEFINITION_SCHEMA",
    "CommandImportError",
    "DefinitionError",
    "Environment",
    "HealthCheck",
    "ImportedCommand",
    "ModelDefinition",
    "ModelSpec",
    "PreStartAction",
    "Problem",
    "ServiceDefinition",
    "ServiceSpec",
    "VariantDefaults",
    "import_command",
    "parse_memory",
    "parse_model_definition",
    "parse_service_definition",
]
