"""The agent's process: listening socket, start banner, signals and the command-line entry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from nodes.agent.app import AGENT, build_app
from nodes.agent.config import AgentConfig, agent_version, parse_args

try:
    import uvloop
except ImportError:  # optional speed-up; it ships with uvicorn[standard]
    HAVE_UVLOOP = False
else:
    HAVE_UVLOOP = True

# How long shutdown waits for in-flight requests (a long stream would otherwise hold it).
SHUTDOWN_GRACE_S = 2.0


def banner(config: AgentConfig, url: str, fingerprint: str) -> str:
    """Return the start banner: URL, fingerprint and where the credential is (never itself)."""
    return (
        f"Nexus agent {agent_version()} on {url}\n"
        f"fingerprint: {fingerprint}\n"
        f"credential: {config.credential_source}\n"
    )


async def serve(config: AgentConfig) -> None:
    """Run the agent until SIGTERM or SIGINT; the processes it started keep running."""
    app = build_app(config)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        handler_cancellation=True,  # a caller's disconnect cancels its forwarded request
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        try:
            await site.start()
        except OSError as error:
            raise SystemExit(f"cannot listen on {config.host}:{config.port}: {error}") from None
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
        loop.add_signal_handler(signal.SIGINT, stopping.set)
        host = f"[{config.host}]" if ":" in config.host else config.host
        port = runner.addresses[0][1]
        fingerprint = app[AGENT].identity.fingerprint
        sys.stdout.write(banner(config, f"http://{host}:{port}", fingerprint))
        sys.stdout.flush()
        await stopping.wait()
    finally:
        await runner.cleanup()


def run(config: AgentConfig) -> None:
    """Serve until signalled."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    run_loop = uvloop.run if HAVE_UVLOOP else asyncio.run
    with contextlib.suppress(KeyboardInterrupt):  # a SIGINT that lands before the handler is set
        run_loop(serve(config))


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve until signalled."""
    run(parse_args(argv))
