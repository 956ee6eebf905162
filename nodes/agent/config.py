"""The agent's command-line options, shared by `nexus-agent` and `manage.py runagent`."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from nodes.agent.identity import write_private_file

CREDENTIAL_ENV = "NEXUS_AGENT_CREDENTIAL"
CREDENTIAL_FILE = "credential"
# How long a forwarded request may wait for the runtime's next bytes; a non-streamed
# completion sends nothing until it is done, so this bounds a whole generation.
UPSTREAM_TIMEOUT_ENV = "NEXUS_AGENT_UPSTREAM_TIMEOUT_S"
DEFAULT_UPSTREAM_TIMEOUT_S = 600.0


def agent_version() -> str:
    """Return the installed Nexus version, or the source tree's when it is not installed."""
    try:
        return metadata.version("nexus")
    except metadata.PackageNotFoundError:
        return "0.1.0"


@dataclass(frozen=True)
class AgentConfig:
    """How one agent runs."""

    data_dir: Path
    credential: str
    # Where the credential came from, for the start banner (never the credential itself).
    credential_source: str
    host: str = "127.0.0.1"
    port: int = 7100
    allowed_dirs: tuple[Path, ...] = ()
    # Ports other programs on this machine own (the controller's): never given to a process.
    reserved_ports: frozenset[int] = frozenset()
    watch: tuple[str, ...] = ()
    upstream_timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S


def add_options(parser: argparse.ArgumentParser) -> None:
    """Declare the agent's options on a parser."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=7100, help="port to listen on")
    parser.add_argument(
        "--data-dir", required=True, type=Path, help="the agent's key, credential, logs and models"
    )
    parser.add_argument(
        "--credential",
        help=f"the node credential callers must present (default: ${CREDENTIAL_ENV}, "
        "else one generated into <data-dir>/credential)",
    )
    parser.add_argument(
        "--allow-dir",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="a directory the agent may read models from and run commands in (repeatable)",
    )
    parser.add_argument(
        "--reserve-port",
        action="append",
        default=[],
        type=int,
        metavar="PORT",
        help="a port that another program on this machine uses: never allocated to a process, "
        "and refused when a process asks for it (repeatable)",
    )
    parser.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="URL",
        help="an OpenAI-compatible runtime the agent reports but does not manage, e.g. "
        "http://127.0.0.1:11434/v1 (repeatable)",
    )


def parse_args(argv: Sequence[str] | None = None) -> AgentConfig:
    """Parse `nexus-agent` arguments into a configuration."""
    parser = argparse.ArgumentParser(
        prog="nexus-agent", description="Run the Nexus agent on this machine."
    )
    add_options(parser)
    return config_from_options(vars(parser.parse_args(argv)))


def config_from_options(
    options: Mapping[str, Any], env: Mapping[str, str] = os.environ
) -> AgentConfig:
    """Build the configuration from parsed options, making the data dir and credential."""
    data_dir = Path(options["data_dir"]).expanduser().resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    credential, source = resolve_credential(options.get("credential"), data_dir, env)
    allowed = [data_dir]
    for directory in options.get("allow_dir") or ():
        resolved = Path(directory).expanduser().resolve()
        if resolved not in allowed:
            allowed.append(resolved)
    timeout = env.get(UPSTREAM_TIMEOUT_ENV)
    return AgentConfig(
        data_dir=data_dir,
        credential=credential,
        credential_source=source,
        host=options.get("host") or "127.0.0.1",
        port=int(options.get("port") or 7100),
        allowed_dirs=tuple(allowed),
        reserved_ports=frozenset(options.get("reserve_port") or ()),
        watch=tuple(url.rstrip("/") for url in options.get("watch") or ()),
        upstream_timeout_s=float(timeout) if timeout else DEFAULT_UPSTREAM_TIMEOUT_S,
    )


def resolve_credential(
    option: str | None, data_dir: Path, env: Mapping[str, str]
) -> tuple[str, str]:
    """Return the credential and where it came from: option, environment, else a stored one."""
    if option:
        return option, "from --credential"
    if env.get(CREDENTIAL_ENV):
        return env[CREDENTIAL_ENV], f"from {CREDENTIAL_ENV}"
    path = data_dir / CREDENTIAL_FILE
    # Made once; a later start (or a racing one) reads the stored credential.
    with contextlib.suppress(FileExistsError):
        write_private_file(path, secrets.token_urlsafe(32).encode())
    credential = path.read_text().strip()
    if not credential:
        raise SystemExit(f"{path} is empty; delete it to have a new credential generated")
    return credential, f"stored in {path}"
