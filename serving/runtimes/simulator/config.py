"""Simulator settings: the command line, the engine configuration and the fault state."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_ERROR_CODES: tuple[int, ...] = (429, 500, 503)


@dataclass(slots=True)
class Faults:
    """Injected misbehaviour; every field can be changed at run time through /sim/faults."""

    error_rate: float = 0.0
    error_codes: tuple[int, ...] = DEFAULT_ERROR_CODES
    hang: bool = False
    cut_stream_after: int | None = None
    stall_stream_after: int | None = None  # tokens sent before the stream goes silent
    fail_health: bool = False
    refuse_connections: bool = False
    slow_start_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Return the faults as JSON-ready values."""
        state = asdict(self)
        state["error_codes"] = list(self.error_codes)
        return state


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """Everything the command line sets; times are in the units their names say."""

    model: str = "demo-8b"
    host: str = "127.0.0.1"
    port: int = 9101
    ttft_ms: float = 50.0
    tpot_ms: float = 10.0
    concurrency: int = 8
    max_tokens_default: int = 16
    max_model_len: int = 32768
    prefix_cache_blocks: int = 256
    block_size: int = 16
    cold_start_s: float = 0.0
    unload_after_idle_s: float = 0.0
    seed: int = 0
    slowdown: float = 0.5
    embedding_dim: int = 64
    api_key: str | None = None
    # Cluster mode (SGLang's flags): rank 0 serves once every other rank joined it over TCP at
    # dist_init_addr; the others serve no HTTP and leave with it.
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    faults: Faults = field(default_factory=Faults)


def parse_error_codes(value: object) -> tuple[int, ...]:
    """Parse status codes from "429,503" or a list; raise ValueError unless all are 4xx/5xx."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValueError("error_codes must be a non-empty list of HTTP status codes")
    codes = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"invalid status code {item!r}")
        try:
            code = int(item)
        except (TypeError, ValueError):
            raise ValueError(f"invalid status code {item!r}") from None
        if not 400 <= code <= 599:
            raise ValueError(f"status code {code} is not an error status (400-599)")
        codes.append(code)
    return tuple(codes)


def _non_negative(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{name} must be a non-negative number")
    return float(value)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


def parse_fault_update(body: object) -> dict[str, Any]:
    """Validate a /sim/faults body; raise ValueError naming the first bad field.

    ``refuse_connections`` may also be a number of seconds, returned under
    ``refuse_connections_for_s``, after which connections are accepted again.
    """
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    update: dict[str, Any] = {}
    for name, value in body.items():
        if name == "error_rate":
            rate = _non_negative(name, value)
            if rate > 1:
                raise ValueError("error_rate must be between 0 and 1")
            update[name] = rate
        elif name == "error_codes":
            update[name] = parse_error_codes(value)
        elif name in ("hang", "fail_health"):
            update[name] = _flag(name, value)
        elif name in ("cut_stream_after", "stall_stream_after"):
            valid = value is None or (
                isinstance(value, int) and not isinstance(value, bool) and value >= 0
            )
            if not valid:
                raise ValueError(f"{name} must be a non-negative integer or null")
            update[name] = value
        elif name == "refuse_connections":
            if isinstance(value, bool):
                update[name] = value
            else:
                update["refuse_connections"] = True
                update["refuse_connections_for_s"] = _non_negative(name, value)
        elif name == "slow_start_s":
            update[name] = _non_negative(name, value)
        else:
            raise ValueError(f"unknown fault {name!r}")
    return update


def _build_parser() -> argparse.ArgumentParser:
    defaults = SimulatorConfig()
    parser = argparse.ArgumentParser(
        prog="python -m serving.runtimes.simulator",
        description="Simulated OpenAI-compatible inference engine (vLLM-like metrics).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--model", default=defaults.model, help="served model id")
    add("--host", default=defaults.host)
    add("--port", type=int, default=defaults.port, help="0 picks a free port")
    add("--ttft-ms", type=float, default=defaults.ttft_ms, help="time to first token")
    add("--tpot-ms", type=float, default=defaults.tpot_ms, help="time per output token")
    add("--concurrency", type=int, default=defaults.concurrency, help="requests generating at once")
    add("--max-tokens-default", type=int, default=defaults.max_tokens_default)
    add("--max-model-len", type=int, default=defaults.max_model_len, help="prompt + output tokens")
    add("--prefix-cache-blocks", type=int, default=defaults.prefix_cache_blocks)
    add("--block-size", type=int, default=defaults.block_size, help="tokens (words) per block")
    add("--cold-start-s", type=float, default=defaults.cold_start_s, help="model load time")
    add(
        "--unload-after-idle-s",
        type=float,
        default=defaults.unload_after_idle_s,
        help="unload the model after this idle time (0 = never)",
    )
    add("--seed", type=int, default=defaults.seed)
    add(
        "--slowdown",
        type=float,
        default=defaults.slowdown,
        help="fractional growth of the per-token time at full concurrency",
    )
    add("--embedding-dim", type=int, default=defaults.embedding_dim)
    add("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1, as vLLM does")
    add("--error-rate", type=float, default=0.0, help="fraction of requests failed on purpose")
    add("--error-codes", type=parse_error_codes, default=DEFAULT_ERROR_CODES, metavar="CODES")
    add("--hang", action="store_true", help="accept requests and never answer")
    add("--cut-stream-after", type=int, default=None, metavar="N", help="cut streams after N")
    add("--fail-health", action="store_true", help="/health answers 503")
    add("--refuse-connections", action="store_true", help="do not accept TCP connections")
    add("--slow-start-s", type=float, default=0.0, help="answer 503 for this long after start")
    add("--nnodes", type=int, default=defaults.nnodes, help="nodes of a cluster replica")
    add("--node-rank", type=int, default=defaults.node_rank, help="0: the main; else a worker")
    add("--dist-init-addr", default=None, metavar="HOST:PORT", help="where the main meets workers")
    return parser


def split_address(address: str | None) -> tuple[str, int] | None:
    """Return (host, port) of "HOST:PORT", or None when it is not one."""
    host, colon, port = (address or "").rpartition(":")
    if not colon or not host or not port.isdecimal() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def parse_args(argv: Sequence[str] | None = None) -> SimulatorConfig:
    """Build the configuration from command-line arguments."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.block_size < 1 or args.embedding_dim < 1:
        parser.error("--concurrency, --block-size and --embedding-dim must be at least 1")
    if not 0 <= args.error_rate <= 1:
        parser.error("--error-rate must be between 0 and 1")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        parser.error("--nnodes must be at least 1 and --node-rank from 0 to nnodes - 1")
    if args.nnodes > 1 and split_address(args.dist_init_addr) is None:
        parser.error("--nnodes above 1 needs --dist-init-addr HOST:PORT")
    faults = Faults(
        error_rate=args.error_rate,
        error_codes=args.error_codes,
        hang=args.hang,
        cut_stream_after=args.cut_stream_after,
        fail_health=args.fail_health,
        refuse_connections=args.refuse_connections,
        slow_start_s=args.slow_start_s,
    )
    fault_names = set(Faults.__dataclass_fields__)
    settings = {k: v for k, v in vars(args).items() if k not in fault_names}
    return SimulatorConfig(faults=faults, **settings)
