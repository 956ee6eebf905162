"""The agent's HTTP application: authentication, errors and the routes of docs/nodes.md."""

from __future__ import annotations

import hmac
import logging
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from nodes.agent.bodies import query_number, read_json_object
from nodes.agent.config import AgentConfig, agent_version
from nodes.agent.errors import NOT_DELIVERED_HEADER, AgentError, invalid
from nodes.agent.forwarding import Forwarder, ProcessProxy, Upstream, new_upstream_session
from nodes.agent.identity import Identity
from nodes.agent.inventory import Inventory
from nodes.agent.jobs import JobRunner
from nodes.agent.metrics import MetricsSampler
from nodes.agent.processes import MAX_GRACE_S, ProcessManager
from nodes.agent.resources import detect_gpus, free_resources, machine_resources

logger = logging.getLogger(__name__)

# Inference bodies (long prompts, batched embeddings) are the largest; anything above is refused.
MAX_BODY_BYTES = 16 * 1024 * 1024
# Challenges are hex nonces; a bound keeps the agent from signing arbitrary large input.
MAX_CHALLENGE_LENGTH = 256
DEFAULT_LOG_LINES = 100
DEFAULT_STOP_GRACE_S = 10.0
# Codes for refusals aiohttp raises itself (routing, body size).
_HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Agent:
    """Everything one running agent holds: identity, processes, jobs, inventory and metrics."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.identity = Identity.load_or_create(config.data_dir)
        self.processes = ProcessManager(config.data_dir, config.allowed_dirs, config.reserved_ports)
        self.jobs = JobRunner(config.data_dir, self.processes, config.allowed_dirs)
        self.metrics = MetricsSampler(self.processes.running)
        self.started_at = (
            datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        )
        self.resources: dict[str, Any] = machine_resources([])
        # Made on start-up, inside the event loop they belong to.
        self.session: aiohttp.ClientSession
        self.inventory: Inventory
        self.forwarder: Forwarder
        self.process_proxy: ProcessProxy

    async def start(self, app: web.Application) -> None:
        """Re-adopt processes and jobs, learn the GPUs, open the runtime session, start sampling."""
        self.processes.recover()
        self.jobs.recover()
        self.resources = machine_resources(await detect_gpus())
        self.session = new_upstream_session()
        self.inventory = Inventory(self.session, self.processes.served_models, self.config.watch)
        upstream = Upstream(self.session, self.config.upstream_timeout_s)
        self.forwarder = Forwarder(upstream, self.inventory)
        self.process_proxy = ProcessProxy(upstream, self.processes, MAX_BODY_BYTES)
        await self.metrics.start()

    async def close(self, app: web.Application) -> None:
        """Stop watching and sampling; the processes keep running for the next agent."""
        await self.metrics.close()
        await self.jobs.close()
        await self.processes.close()
        await self.session.close()

    # -- identity, resources, inventory, metrics --------------------------------------------

    async def info(self, request: web.Request) -> web.Response:
        """GET /agent/v1/info[?challenge=HEX]."""
        body: dict[str, Any] = {
            "agent_version": agent_version(),
            "hostname": socket.gethostname(),
            "fingerprint": self.identity.fingerprint,
            "public_key": self.identity.public_key,
            "started_at": self.started_at,
            "allowed_dirs": [str(directory) for directory in self.config.allowed_dirs],
            "resources": self.resources,
            "free": free_resources(
                self.resources, (p.get("resources") for p in self.processes.running())
            ),
        }
        challenge = request.query.get("challenge")
        if challenge is not None:
            body["challenge_signature"] = self.identity.sign_challenge(
                _checked_challenge(challenge)
            )
        return web.json_response(body)

    async def models(self, request: web.Request) -> web.Response:
        """GET /agent/v1/models."""
        return web.json_response({"data": await self.inventory.models()})

    async def metrics_now(self, request: web.Request) -> web.Response:
        """GET /agent/v1/metrics: the latest background sample."""
        return web.json_response(self.metrics.latest)

    # -- processes ---------------------------------------------------------------------------

    async def start_process(self, request: web.Request) -> web.Response:
        """POST /agent/v1/processes."""
        spec = await read_json_object(request)
        return web.json_response(await self.processes.start(spec), status=201)

    async def list_processes(self, request: web.Request) -> web.Response:
        """GET /agent/v1/processes."""
        return web.json_response({"data": self.processes.list()})

    async def get_process(self, request: web.Request) -> web.Response:
        """GET /agent/v1/processes/{id}."""
        return web.json_response(self.processes.get(request.match_info["id"]))

    async def process_log(self, request: web.Request) -> web.Response:
        """GET /agent/v1/processes/{id}/log?tail=N: the last N lines, plain text."""
        raw = request.query.get("tail")
        lines = DEFAULT_LOG_LINES
        if raw is not None:
            try:
                lines = int(raw)
            except ValueError:
                raise invalid("tail", f"expected an integer, got {raw!r}") from None
        text = self.processes.log_tail(request.match_info["id"], lines)
        return web.Response(text=text, content_type="text/plain")

    async def stop_process(self, request: web.Request) -> web.Response:
        """DELETE /agent/v1/processes/{id}?grace=S."""
        grace_s = query_number(
            request, "grace", DEFAULT_STOP_GRACE_S, minimum=0, maximum=MAX_GRACE_S
        )
        return web.json_response(await self.processes.stop(request.match_info["id"], grace_s))

    async def proxy_to_process(self, request: web.Request) -> web.StreamResponse:
        """ANY /agent/v1/processes/{id}/http[/{path}]: to the process's own port."""
        return await self.process_proxy.proxy(request)

    # -- jobs --------------------------------------------------------------------------------

    async def submit_job(self, request: web.Request) -> web.Response:
        """POST /agent/v1/jobs."""
        spec = await read_json_object(request)
        return web.json_response(await self.jobs.submit(spec), status=202)

    async def list_jobs(self, request: web.Request) -> web.Response:
        """GET /agent/v1/jobs."""
        return web.json_response({"data": self.jobs.list()})

    async def get_job(self, request: web.Request) -> web.Response:
        """GET /agent/v1/jobs/{id}."""
        return web.json_response(self.jobs.get(request.match_info["id"]))

    # -- forwarding --------------------------------------------------------------------------

    async def list_served_models(self, request: web.Request) -> web.Response:
        """GET /v1/models."""
        return await self.forwarder.list_models(request)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/<path>."""
        return await self.forwarder.forward(request)


def _checked_challenge(challenge: str) -> str:
    if not challenge or len(challenge) > MAX_CHALLENGE_LENGTH:
        raise invalid("challenge", f"expected 1 to {MAX_CHALLENGE_LENGTH} hex digits")
    try:
        bytes.fromhex(challenge)
    except ValueError:
        raise invalid("challenge", "expected hex digits") from None
    return challenge


def _error_response(error: AgentError) -> web.Response:
    response = web.json_response(error.body(), status=error.status)
    if error.status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if error.not_delivered:
        response.headers[NOT_DELIVERED_HEADER] = "1"
    return response


def authenticate(credential: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Return the middleware that lets through only requests bearing the node credential."""
    expected = f"Bearer {credential}".encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode(errors="replace")
        # Constant time: how much of a guess matched must not show in the response time.
        if not hmac.compare_digest(given, expected):
            raise AgentError(
                401,
                "invalid_credential",
                "missing or wrong node credential (Authorization: Bearer <credential>)",
                kind="authentication_error",
            )
        return await handler(request)

    return middleware


@web.middleware
async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every refusal, aiohttp's own included, with an OpenAI-shaped JSON body."""
    try:
        return await handler(request)
    except AgentError as error:
        return _error_response(error)
    except web.HTTPException as exception:
        if exception.status < 400:
            raise
        code = _HTTP_ERROR_CODES.get(exception.status, "invalid_request")
        message = f"{request.method} {request.path}: {exception.reason.lower()}"
        response = _error_response(AgentError(exception.status, code, message))
        if exception.status == 405:
            response.headers["Allow"] = exception.headers.get("Allow", "")
        return response
    except Exception:
        # Handlers raise only before answering (forwarding handles its own mid-stream
        # failures), so a JSON answer can still be sent.
        logger.exception("%s %s failed", request.method, request.path)
        return _error_response(
            AgentError(500, "internal_error", "the agent failed; see its log", kind="server_error")
        )


AGENT = web.AppKey("agent", Agent)


def build_app(config: AgentConfig) -> web.Application:
    """Return the agent's application; its start-up re-adopts processes and jobs."""
    agent = Agent(config)
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        middlewares=[answer_errors, authenticate(config.credential)],
    )
    app[AGENT] = agent
    app.on_startup.append(agent.start)
    app.on_cleanup.append(agent.close)
    router = app.router
    router.add_get("/agent/v1/info", agent.info)
    router.add_get("/agent/v1/models", agent.models)
    router.add_get("/agent/v1/metrics", agent.metrics_now)
    router.add_post("/agent/v1/processes", agent.start_process)
    router.add_get("/agent/v1/processes", agent.list_processes)
    router.add_get("/agent/v1/processes/{id}", agent.get_process)
    router.add_delete("/agent/v1/processes/{id}", agent.stop_process)
    router.add_get("/agent/v1/processes/{id}/log", agent.process_log)
    router.add_route("*", "/agent/v1/processes/{id}/http", agent.proxy_to_process)
    router.add_route("*", "/agent/v1/processes/{id}/http/{path:.*}", agent.proxy_to_process)
    router.add_post("/agent/v1/jobs", agent.submit_job)
    router.add_get("/agent/v1/jobs", agent.list_jobs)
    router.add_get("/agent/v1/jobs/{id}", agent.get_job)
    router.add_get("/v1/models", agent.list_served_models)
    router.add_post("/v1/{path:.+}", agent.forward)
    return app
