"""OpenAPI description of Nexus's own authentication."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """Describe client tokens as HTTP bearer authentication."""

    target_class = "nexus.auth.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "nx-<secret>",
            "description": "A client token issued by POST /api/v1/tokens/ or `nexus_token create`.",
        }
