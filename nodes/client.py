"""A synchronous client of one node's agent (docs/nodes.md), for services and Celery tasks.

Failures come in two kinds: the agent could not be reached (`AgentUnreachable`) or it answered
with an error (`AgentRefused`). Their text is shown to operators and stored on the node, so it is
in plain words and never carries the node credential.
"""

from __future__ import annotations

import errno
import functools
import ssl
from typing import Any

import httpx
from django.conf import settings

AGENT_PREFIX = "/agent/v1"


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Return this process's TLS context for agents: httpx's default (certifi's roots), built once.

    Building one parses the CA bundle, about 23 ms of CPU; a client built with its own paid that
    every time, and the serving tick builds a client per node it calls, several times a second.
    """
    return httpx.create_ssl_context(trust_env=False)


class AgentClientError(Exception):
    """The agent could not do what was asked."""


class AgentUnreachable(AgentClientError):
    """No answer from the agent: refused, timed out, name unknown, connection dropped."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AgentRefused(AgentClientError):
    """The agent answered with an error (its OpenAI-shaped body, or something unexpected)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _connect_reason(error: httpx.TransportError) -> str:
    """Return why a connection failed, in plain words."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == (
            errno.ECONNREFUSED
        ):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    text = str(error)
    lowered = text.lower()
    if "refused" in lowered:
        return "connection refused"
    if "name or service not known" in lowered or "nodename nor servname" in lowered:
        return "unknown host name"
    if "no route to host" in lowered:
        return "no route to host"
    return f"cannot connect: {text}" if text else "cannot connect"


class AgentClient:
    """Call one agent's API with the node credential; a `with` block closes the connection."""

    def __init__(self, address: str, credential: str, timeout_s: float | None = None) -> None:
        self.address = address.rstrip("/")
        # Read at call time (not as the default) so that settings overrides apply.
        if timeout_s is None:
            timeout_s = settings.NEXUS_AGENT_TIMEOUT_S
        self.timeout_s = float(timeout_s)
        self._credential = credential
        # No environment proxies: agents sit on the operator's own network.
        self._http = httpx.Client(
            base_url=self.address,
            headers={"Authorization": f"Bearer {credential}"},
            timeout=self.timeout_s,
            verify=_tls_context(),
            trust_env=False,
        )

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AgentClient({self.address!r})"

    def close(self) -> None:
        self._http.close()

    def info(self, challenge: str | None = None) -> dict[str, Any]:
        """Return the agent's identity and resources; signed over the challenge when given."""
        params = {"challenge": challenge} if challenge else None
        return self._json("GET", "/info", params=params)

    def models(self) -> list[dict[str, Any]]:
        """Return the models the node serves."""
        return self._json("GET", "/models").get("data", [])

    def metrics(self) -> dict[str, Any]:
        """Return the node's and its processes' current usage."""
        return self._json("GET", "/metrics")

    def start_process(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Start a process on the node (`${PORT}` gets a free port) and return it."""
        return self._json("POST", "/processes", json=spec)

    def process(self, process_id: str) -> dict[str, Any]:
        return self._json("GET", f"/processes/{process_id}")

    def processes(self) -> list[dict[str, Any]]:
        found = self._json("GET", "/processes")
        # The contract lists processes; accept a {"data": [...]} envelope as well.
        return found.get("data", []) if isinstance(found, dict) else found

    def stop_process(self, process_id: str, grace_s: float = 10) -> dict[str, Any]:
        """Stop a process (SIGTERM, SIGKILL after grace_s) and return it, stopped."""
        # The agent may wait the whole grace period before it answers.
        timeout = self.timeout_s + grace_s
        return self._json(
            "DELETE", f"/processes/{process_id}", params={"grace": grace_s}, timeout=timeout
        )

    def process_log(self, process_id: str, tail: int = 100) -> str:
        """Return the last lines of a process's output."""
        return self._send("GET", f"/processes/{process_id}/log", params={"tail": tail}).text

    def process_http_status(self, process_id: str, path: str, timeout_s: float) -> int:
        """Return the status a process answers a GET of `path` with, through the agent (a
        trial's health probe); raise AgentUnreachable when no answer came in time."""
        try:
            response = self._http.get(
                f"{AGENT_PREFIX}/processes/{process_id}/http{path}", timeout=timeout_s
            )
        except httpx.TimeoutException:
            raise AgentUnreachable(f"no answer within {timeout_s:g} s") from None
        except httpx.TransportError as error:
            raise AgentUnreachable(self._scrubbed(_connect_reason(error))) from None
        return response.status_code

    def submit_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit a job (a deploy) and return it as accepted."""
        return self._json("POST", "/jobs", json=spec)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/jobs/{job_id}")

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise AgentRefused(
                response.status_code,
                "invalid_response",
                f"{self.address} did not answer with JSON; is it a Nexus agent?",
            ) from None

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, AGENT_PREFIX + path, **kwargs)
        except httpx.TimeoutException:
            timeout = kwargs.get("timeout", self.timeout_s)
            raise AgentUnreachable(f"timed out after {timeout:g} s") from None
        except httpx.RemoteProtocolError:
            raise AgentUnreachable("the connection closed before an answer") from None
        except httpx.TransportError as error:
            raise AgentUnreachable(self._scrubbed(_connect_reason(error))) from None
        if response.is_error:
            raise self._refusal(response)
        return response

    def _refusal(self, response: httpx.Response) -> AgentRefused:
        status = response.status_code
        if status == 401:
            return AgentRefused(401, "invalid_credential", "the agent refused the node credential")
        try:
            error = response.json()["error"]
            code, message = str(error.get("code") or "error"), str(error["message"])
        except (ValueError, KeyError, TypeError, AttributeError):
            code = "unexpected_response"
            message = f"HTTP {status} from {self.address}; is it a Nexus agent?"
        return AgentRefused(status, code, self._scrubbed(message))

    def _scrubbed(self, text: str) -> str:
        # An agent (or a proxy before it) could echo the header back; never pass it on.
        return text.replace(self._credential, "[credential]") if self._credential else text
