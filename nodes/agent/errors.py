"""The agent's errors: an HTTP status and an OpenAI-shaped body, raised anywhere, answered once."""

from __future__ import annotations

from typing import Any

# Set on an error the agent answered before anything reached the runtime (it is not running,
# has no port, or refused the connection): a gateway may send the request, whatever its method,
# to another replica. Never on a timeout or a failure after the request was sent.
NOT_DELIVERED_HEADER = "X-Nexus-Not-Delivered"


class AgentError(Exception):
    """A request the agent refuses, with the status and error code the caller sees."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        kind: str = "invalid_request_error",
        *,
        not_delivered: bool = False,
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.kind = kind
        self.not_delivered = not_delivered

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


def invalid(field: str, problem: str) -> AgentError:
    """A 400 naming the field and what is wrong with it, e.g. `argv: required`."""
    return AgentError(400, "invalid_request", f"{field}: {problem}")


def not_found(code: str, what: str) -> AgentError:
    return AgentError(404, code, f"{what} does not exist on this node")
