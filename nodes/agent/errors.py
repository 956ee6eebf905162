"""The agent's errors: an HTTP status and an OpenAI-shaped body, raised anywhere, answered once."""

from __future__ import annotations

from typing import Any


class AgentError(Exception):
    """A request the agent refuses, with the status and error code the caller sees."""

    def __init__(self, status: int, code: str, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


def invalid(field: str, problem: str) -> AgentError:
    """A 400 naming the field and what is wrong with it, e.g. `argv: required`."""
    return AgentError(400, "invalid_request", f"{field}: {problem}")


def not_found(code: str, what: str) -> AgentError:
    return AgentError(404, code, f"{what} does not exist on this node")
