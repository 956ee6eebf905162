"""Reading the `usage` an OpenAI-compatible answer reports: prompt and completion tokens.

A JSON answer carries it at its end; a stream carries it in its last data event when the request
asked for it (`stream_options.include_usage`), as null in the events before. The gateway keeps
only an answer's last few chunks and reads them once the answer is complete.
"""

from __future__ import annotations

import json
from typing import Any

USAGE_KEY = b'"usage":'
# A stream's usage event and the [DONE] after it fit in this many of its last chunks.
TAIL_CHUNKS = 3
_DECODER = json.JSONDecoder()


def read_usage(data: bytes) -> tuple[int, int] | None:
    """Return the (prompt, completion) tokens of the last usage object in `data`, if any."""
    end = len(data)
    while (at := data.rfind(USAGE_KEY, 0, end)) != -1:
        end = at
        text = data[at + len(USAGE_KEY) :].decode("utf-8", "replace").lstrip()
        try:
            value, _ = _DECODER.raw_decode(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            return _count(value, "prompt_tokens"), _count(value, "completion_tokens")
    return None


def ask_for_usage(payload: dict[str, Any]) -> None:
    """Make a streamed request's answer end with its usage (a tokens limit must count it)."""
    options = payload.get("stream_options")
    if isinstance(options, dict):
        options["include_usage"] = True
    else:
        payload["stream_options"] = {"include_usage": True}


def _count(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and value > 0 else 0
