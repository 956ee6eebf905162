"""Errors the gateway answers with, in the OpenAI error shape."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime


class GatewayError(Exception):
    """A request the gateway refuses or cannot complete, with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.error_type = error_type
        self.param = param
        self.headers = headers

    def body(self) -> bytes:
        return error_body(self.message, self.error_type, self.code, self.param)


def error_body(message: str, error_type: str, code: str, param: str | None = None) -> bytes:
    """Return an OpenAI-shaped error document."""
    document = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return json.dumps(document).encode()


def missing_token() -> GatewayError:
    return GatewayError(
        401,
        "Missing client token: send 'Authorization: Bearer <token>'.",
        code="invalid_api_key",
        headers=((b"www-authenticate", b"Bearer"),),
    )


def missing_service_token(service: str) -> GatewayError:
    return GatewayError(
        401,
        f"Service '{service}' is not open to the public: send"
        " 'Authorization: BackendAI <token>' or 'Authorization: Bearer <token>'.",
        code="invalid_api_key",
        headers=((b"www-authenticate", b"Bearer"),),
    )


def invalid_token() -> GatewayError:
    return GatewayError(
        401,
        "Invalid client token.",
        code="invalid_api_key",
        headers=((b"www-authenticate", b"Bearer"),),
    )


def revoked_token() -> GatewayError:
    return GatewayError(
        401,
        "This token was revoked.",
        code="invalid_api_key",
        headers=((b"www-authenticate", b"Bearer"),),
    )


def expired_token(expires_at: float) -> GatewayError:
    moment = datetime.fromtimestamp(expires_at, UTC).isoformat(timespec="seconds")
    return GatewayError(
        401,
        f"This token expired at {moment.replace('+00:00', 'Z')}.",
        code="token_expired",
        headers=((b"www-authenticate", b"Bearer"),),
    )


def pool_forbidden(model: str, *, managed: bool = False) -> GatewayError:
    why = ": a model service's pool, which only that service's tokens reach" if managed else ""
    return GatewayError(
        403,
        f"This client token may not use '{model}'{why}.",
        code="pool_not_allowed",
        error_type="permission_error",
        param="model",
    )


def admin_token() -> GatewayError:
    return GatewayError(
        403,
        "An admin token calls the admin API, not inference: /v1 and /serve take a client token.",
        code="admin_token_not_allowed",
        error_type="permission_error",
    )


def service_forbidden(service: str) -> GatewayError:
    return GatewayError(
        403,
        f"This token may not call service '{service}'.",
        code="service_not_allowed",
        error_type="permission_error",
    )


def service_not_found(service: str) -> GatewayError:
    return GatewayError(404, f"Service '{service}' does not exist.", code="service_not_found")


def invalid_path(path: str) -> GatewayError:
    return GatewayError(
        400,
        f"The path {path!r} has a '.' or '..' segment, which /serve refuses.",
        code="invalid_path",
    )


def model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model '{model}' does not exist. Use '@pool/<slug>' with a pool's slug;"
        " GET /v1/models lists the ones this token may use.",
        code="model_not_found",
        param="model",
    )


def invalid_json(reason: str) -> GatewayError:
    return GatewayError(400, f"The request body is not valid JSON: {reason}.", code="invalid_json")


def invalid_body(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, code="invalid_request", param=param)


def missing_model() -> GatewayError:
    return GatewayError(
        400, "The request has no 'model': send '@pool/<slug>'.", code="missing_model", param="model"
    )


def body_too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"The request body exceeds the limit of {limit} bytes (NEXUS_MAX_BODY_BYTES).",
        code="request_too_large",
    )


def nesting_too_deep() -> GatewayError:
    return GatewayError(400, "The request body's JSON is nested too deeply.", code="invalid_json")


def url_too_long(limit: int) -> GatewayError:
    return GatewayError(
        414,
        f"The request URL exceeds the limit of {limit} bytes (NEXUS_MAX_URL_BYTES).",
        code="uri_too_long",
    )


def headers_too_large(limit: int) -> GatewayError:
    return GatewayError(
        431,
        f"The request headers exceed the limit of {limit} bytes (NEXUS_MAX_HEADER_BYTES).",
        code="request_header_fields_too_large",
    )


def headers_too_slow(limit_s: float) -> GatewayError:
    return GatewayError(
        408,
        f"The request headers did not arrive within {limit_s:g} s (NEXUS_HEADER_TIMEOUT_S).",
        code="request_timeout",
    )


def body_too_slow(limit_s: float) -> GatewayError:
    return GatewayError(
        408,
        f"No byte of the request body arrived for {limit_s:g} s (NEXUS_BODY_TIMEOUT_S).",
        code="request_timeout",
    )


def internal_error() -> GatewayError:
    return GatewayError(
        500,
        "The gateway failed unexpectedly; the error is in its log under this request id.",
        code="internal_error",
        error_type="server_error",
    )


def no_target(slug: str, kind: str, skipped: list[str]) -> GatewayError:
    reasons = f": {'; '.join(skipped)}" if skipped else " (it has no targets)"
    return GatewayError(
        503,
        f"Pool '{slug}' has no target that can take this {kind} request now{reasons}.",
        code="no_target_available",
        error_type="server_error",
    )


def no_replica(service: str, ready: int, desired: int, skipped: list[str]) -> GatewayError:
    """Say that none of a service's replicas can take the request, and how many are ready."""
    counts = f"({ready} of {desired} ready)"
    if ready:
        message = f"Service '{service}' has no replica that can take this request now {counts}"
    else:
        message = f"Service '{service}' has no ready replica {counts}"
    reasons = f": {'; '.join(skipped)}" if skipped else ""
    return GatewayError(
        503, f"{message}{reasons}.", code="no_target_available", error_type="server_error"
    )


def queue_full(label: str, reason: str, retry_after_s: int) -> GatewayError:
    return GatewayError(
        429,
        f"{label} is busy and cannot queue this request ({reason}); retry after {retry_after_s} s.",
        code="queue_full",
        error_type="rate_limit_error",
        headers=((b"retry-after", str(retry_after_s).encode()),),
    )


def rate_limited(token: str, limit: str, value: int, retry_after_s: float) -> GatewayError:
    """Refuse a request over one of its token's limits (pools.balancer.limits)."""
    seconds = max(1, math.ceil(retry_after_s))
    return GatewayError(
        429,
        f"Token '{token}' is over its limit of {value} {limit}; retry after {seconds} s.",
        code="rate_limit_exceeded",
        error_type="rate_limit_error",
        headers=((b"retry-after", str(seconds).encode()),),
    )


def queue_timeout(label: str, waited_s: float) -> GatewayError:
    return GatewayError(
        503,
        f"{label} had no free target within {waited_s:.1f} s of queueing.",
        code="queue_timeout",
        error_type="server_error",
    )


def invalid_queue_timeout(value: str) -> GatewayError:
    return invalid_body(
        f"X-Nexus-Queue-Timeout must be a number of seconds, not {value!r}.", param=None
    )


def target_unreachable(target: str) -> GatewayError:
    return GatewayError(
        502,
        f"Target '{target}' could not be reached.",
        code="target_unreachable",
        error_type="server_error",
    )


def target_refused(target: str, status: int) -> GatewayError:
    return GatewayError(
        status,
        f"Target '{target}' refused the request with {status}, and no other target could take it.",
        code="target_refused",
        error_type="rate_limit_error" if status == 429 else "server_error",
    )


def target_misconfigured(target: str, what: str) -> GatewayError:
    return GatewayError(
        502,
        f"Target '{target}' is misconfigured ({what}), and no other target could take the request.",
        code="target_misconfigured",
    )


def target_timeout(target: str, which: str = "") -> GatewayError:
    """Say the target did not answer in time; `which` names the pool's timeout that passed."""
    detail = f": {which} passed" if which else ""
    return GatewayError(
        504,
        f"Target '{target}' did not answer in time{detail}.",
        code="target_timeout",
        error_type="server_error",
    )


def unknown_route(method: str, path: str) -> GatewayError:
    return GatewayError(404, f"Unknown route: {method} {path}.", code="unknown_url")


def method_not_allowed(method: str, path: str) -> GatewayError:
    return GatewayError(405, f"{method} is not allowed on {path}.", code="method_not_allowed")


def shutting_down() -> GatewayError:
    return GatewayError(
        503,
        "This Nexus process is shutting down: send the request again (another process or the"
        " restarted one takes it).",
        code="shutting_down",
        error_type="server_error",
        headers=((b"connection", b"close"), (b"retry-after", b"1")),
    )


def cut_by_shutdown() -> bytes:
    """Return the error event that ends a stream still running when the shutdown grace ran out."""
    return error_body(
        "The stream was ended: this Nexus process is shutting down and its grace period ran out.",
        "server_error",
        "shutting_down",
    )
