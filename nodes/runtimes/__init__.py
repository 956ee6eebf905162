"""The runtime catalogue (pure; importable by the controller's apps and by the agent alike)."""

from __future__ import annotations

from .catalogue import (
    BACKEND_MODEL_NAME,
    DEPLOYABLE_NAMES,
    DIST_PORT_PLACEHOLDER,
    FORMER_NAMES,
    PORT_PLACEHOLDER,
    PYTHON_PLACEHOLDER,
    RUNTIME_NAMES,
    RUNTIMES,
    ClusterPart,
    LaunchInput,
    Runtime,
    RuntimeVariantError,
    build_cluster,
    build_command,
    build_environ,
    checked_parameters,
    concurrency_of,
    fill_cluster_placeholders,
    metric_names,
    runtime,
)
from .parameters import PARAMETER_TABLES, Parameter, ParameterError, ParameterTable

__all__ = [
    "BACKEND_MODEL_NAME",
    "DEPLOYABLE_NAMES",
    "DIST_PORT_PLACEHOLDER",
    "FORMER_NAMES",
    "PARAMETER_TABLES",
    "PORT_PLACEHOLDER",
    "PYTHON_PLACEHOLDER",
    "RUNTIMES",
    "RUNTIME_NAMES",
    "ClusterPart",
    "LaunchInput",
    "Parameter",
    "ParameterError",
    "ParameterTable",
    "Runtime",
    "RuntimeVariantError",
    "build_cluster",
    "build_command",
    "build_environ",
    "checked_parameters",
    "concurrency_of",
    "fill_cluster_placeholders",
    "metric_names",
    "runtime",
]
