"""The suite's own HTTP calls to the servers it starts: `LOOPBACK.get(url, timeout=2)`.

`httpx.get()` and its siblings build a client per call, and each client a TLS context from
certifi's CA bundle: about 23 ms of CPU for a call that is plain HTTP to 127.0.0.1. The serving,
nodes and reliability tests alone made about 1,500 such calls a run, a helper polling a starting
server every 50 ms spending half a core on them (docs/running.md). This client is built once per
process and shared by its threads (httpx clients are thread-safe). It keeps no connection alive,
so that every call opens its own as `httpx.get()` did (a server a test killed refuses the next
call instead of leaving a stale connection), has no limit on connections (tests send hundreds at
once), and reads no proxy settings from the environment: loopback goes direct.
"""

from __future__ import annotations

import httpx

LOOPBACK = httpx.Client(
    trust_env=False,
    limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
)
