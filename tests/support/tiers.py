"""Test tiers: which tier a test belongs to, decided from its path and from what it and its
fixtures call, and a guard that a `unit` test really starts no process and opens no connection.

Tiers (docs/running.md): `unit` (no process, no network but the database and Redis), `live`
(real processes or servers over loopback), `e2e` (Chromium), `system` (tests/system). A test
may say its tier itself (`pytestmark = pytest.mark.live`); otherwise it is derived here.
"""

from __future__ import annotations

import inspect
import socket
import sys
import threading
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.support import preloaded

TIERS = ("unit", "live", "e2e", "system")

# Names whose use means a process or a listening server (any use of the subprocess module or of
# tests/support/preloaded.py, a socket's listen()): the starters in tests/support reach these, so
# following a test's helpers down to them finds every test that starts something. `free_port`
# counts too: a test that asks for a free port connects to it, even when nothing listens there
# (an unreachable engine or node is then the behaviour under test).
LIVE_NAMES = frozenset(
    {
        "subprocess",
        "preloaded",
        "Popen",
        "create_subprocess_exec",
        "create_subprocess_shell",
        "free_port",
        "start_server",
        "TCPSite",
        "ThreadingHTTPServer",
        "listen",
    }
)
E2E_NAMES = frozenset({"sync_playwright"})


def _code_objects(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _functions_of(value: Any) -> list[Callable[..., Any]]:
    """Return the test-suite functions behind a name: a function, a wrapped one, or a class's."""
    value = inspect.unwrap(value) if callable(value) else value
    if inspect.isfunction(value):
        return [value]
    if inspect.isclass(value):
        return [
            inspect.unwrap(member)
            for member in vars(value).values()
            if inspect.isfunction(inspect.unwrap(member))
        ]
    return []


class Classifier:
    """Finds the strongest tier name a function reaches, following the suite's own helpers."""

    def __init__(self) -> None:
        self._seen: dict[types.CodeType, str] = {}

    def tier_of(self, function: Callable[..., Any]) -> str:
        function = inspect.unwrap(function)
        code = getattr(function, "__code__", None)
        if code is None:
            return "unit"
        if code in self._seen:
            return self._seen[code]
        self._seen[code] = "unit"  # a cycle adds nothing
        tier = "unit"
        names: set[str] = set()
        for nested in _code_objects(code):
            names.update(nested.co_names)
        if names & E2E_NAMES:
            tier = "e2e"
        elif names & LIVE_NAMES:
            tier = "live"
        else:
            namespace = getattr(function, "__globals__", {})
            for name in names:
                value = namespace.get(name)
                module = getattr(value, "__module__", None) or ""
                if not module.startswith("tests."):
                    continue
                for helper in _functions_of(value):
                    tier = strongest(tier, self.tier_of(helper))
        self._seen[code] = tier
        return tier


def strongest(*tiers: str) -> str:
    """Return the tier that demands most of the machine (a live fixture makes its test live)."""
    return max(tiers, key=TIERS.index)


def tier_from_path(path: Path, tests_root: Path) -> str | None:
    top = path.relative_to(tests_root).parts[0]
    return {"system": "system", "e2e": "e2e"}.get(top)


class UnitGuard:
    """Records processes and connections that a `unit` test makes (an audit hook cannot be
    removed, so one is installed for the session and only listens while a unit test runs)."""

    def __init__(self, allowed: Iterable[tuple[str, int]]) -> None:
        self.allowed = set()
        for host, port in allowed:
            self.allowed |= {(host, port), (socket.gethostbyname(host), port)}
        self.active = False
        self.thread = threading.main_thread().ident
        self.seen: list[str] = []
        sys.addaudithook(self._hear)

    def _hear(self, event: str, args: tuple[Any, ...]) -> None:
        # Only the test's own thread: a thread an earlier live test left behind (a client still
        # retrying a server that test stopped) is not what this test does.
        if not self.active or threading.get_ident() != self.thread:
            return
        if event in ("subprocess.Popen", "os.posix_spawn", "os.fork"):
            self.seen.append(f"started a process ({event} {args[:2]!r})")
        elif event in ("socket.connect", "socket.bind") and len(args) == 2:
            sock, address = args
            family = getattr(sock, "family", None)
            if family == socket.AF_UNIX and str(address).startswith(preloaded.SOCKET_PREFIX):
                self.seen.append(f"started a process (through the preloader at {address})")
                return
            if family not in (socket.AF_INET, socket.AF_INET6):
                return
            host, port = address[0], address[1]
            if event == "socket.connect" and (host, port) in self.allowed:
                return
            self.seen.append(f"{event.split('.')[1]} to {host}:{port}")
