"""Reading request bodies and query parameters the way every agent route refuses bad ones."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from nodes.agent.errors import AgentError, invalid


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Return a body parsed as a JSON object; 400 `invalid_json` when it is not JSON at all."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise AgentError(400, "invalid_json", f"the body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise invalid("body", "expected a JSON object")
    return body


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """Return the request's body as a JSON object."""
    return parse_json_object(await request.read())


def query_number(
    request: web.Request, name: str, default: float, *, minimum: float, maximum: float
) -> float:
    """Return a numeric query parameter within bounds, or 400 naming it."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise invalid(name, f"expected a number, got {raw!r}") from None
    if not minimum <= value <= maximum:
        raise invalid(name, f"expected a number from {minimum:g} to {maximum:g}")
    return value
