"""The runtimes a deploy job can put a model on: how each is installed and the argv that serves it.

The tables and argv builders are pure; `install` and `gpu_missing` are the only parts that run
anything (pip in a virtual environment, nvidia-smi).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nodes.agent.resources import detect_gpus
from nodes.runtimes import catalogue

NAMES = catalogue.DEPLOYABLE_NAMES
STAMP_FILE = "nexus-installed.json"
# llama-cpp-python compiles llama.cpp (about 5 minutes on a small machine) and vLLM pulls
# gigabytes of wheels; an install that takes longer than this is stuck, not slow.
INSTALL_TIMEOUT_S = 3600.0
_PIP_TAIL_LINES = 15


class InstallError(Exception):
    """A runtime that cannot be installed or cannot run on this node; the message says why."""


@dataclass(frozen=True)
class RuntimeSpec:
    """A deploy job's validated `runtime` object."""

    name: str
    requirement: str | None = None
    argv: tuple[str, ...] = ()

    def requirements(self) -> tuple[str, ...]:
        """Return the pip requirements this runtime needs; empty when nothing is installed."""
        install = catalogue.runtime(self.name).install
        if install is not None:
            return (install.requirement,)
        if self.name == "custom" and self.requirement:
            return (self.requirement,)
        return ()

    def build_env(self) -> dict[str, str]:
        """Return the environment pip builds this runtime's requirements in, beyond the node's."""
        install = catalogue.runtime(self.name).install
        return dict(install.build_env) if install is not None else {}

    def venv(self, data_dir: Path) -> Path | None:
        """Return the virtual environment this runtime lives in, or None when it needs none."""
        install = catalogue.runtime(self.name).install
        if install is not None:
            return data_dir / "runtimes" / install.venv
        if self.name == "custom" and self.requirement:
            # One environment per requirement, so two custom runtimes never share packages.
            digest = hashlib.sha256(self.requirement.encode()).hexdigest()[:12]
            return data_dir / "runtimes" / f"custom-{digest}"
        return None

    def ready_timeout_s(self) -> float:
        """Return how long the started runtime may take to list its model."""
        return catalogue.runtime(self.name).ready_timeout_s


def serve_argv(
    runtime: RuntimeSpec, venv: Path | None, model_path: Path, model_name: str
) -> list[str]:
    """Return the argv that serves the model on `${PORT}` (the process manager fills it in).

    The catalogue's command, as a service of that runtime runs it, with the runtime's own
    interpreter when the job installed one (its other commands resolve first through PATH,
    `serve_env`).
    """
    path = str(model_path)
    if runtime.name == "custom":
        substitutions = {"${MODEL_PATH}": path, "${MODEL_NAME}": model_name}
        argv = [_substitute(arg, substitutions) for arg in runtime.argv]
        # A bare command name means the console script the requirement installed, if it did.
        if venv is not None and "/" not in argv[0] and (venv / "bin" / argv[0]).exists():
            argv[0] = str(venv / "bin" / argv[0])
        return argv
    python = str(venv / "bin" / "python") if venv is not None else catalogue.PYTHON_PLACEHOLDER
    return catalogue.build_command(
        runtime.name,
        model_path=path,
        model_name=model_name,
        port=catalogue.PORT_PLACEHOLDER,
        env={},
        python=python,
    )


def serve_env(venv: Path | None) -> dict[str, str]:
    """Return the environment additions that make the runtime's own commands resolve first."""
    if venv is None:
        return {}
    return {
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
    }


def _substitute(arg: str, substitutions: dict[str, str]) -> str:
    for placeholder, value in substitutions.items():
        arg = arg.replace(placeholder, value)
    return arg


async def gpu_missing(runtime: RuntimeSpec) -> str | None:
    """Return why the runtime cannot run here when it needs an NVIDIA GPU and none is present."""
    found = catalogue.runtime(runtime.name)
    if found.install is None or not found.install.needs_gpu or await detect_gpus():
        return None
    label = found.label
    return f"{label} needs an NVIDIA GPU; this node has none (nvidia-smi found no GPU)"


def installed(
    venv: Path, requirements: Sequence[str], build_env: dict[str, str] | None = None
) -> bool:
    """Return whether the environment's stamp says these requirements were installed, built
    with this environment."""
    try:
        stamp = json.loads((venv / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp == _stamp(requirements, build_env or {})


def _stamp(requirements: Sequence[str], build_env: dict[str, str]) -> dict[str, object]:
    stamp: dict[str, object] = {"requirements": list(requirements)}
    if build_env:
        stamp["build_env"] = build_env
    return stamp


def pip_build(build_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Return pip's extra options and environment for building with `build_env`.

    The node's own value of a name wins. pip's wheel cache does not key on the environment, so
    a wheel it built before with other flags would come back: with a build environment, pip
    builds afresh (once per environment: the stamp then says it is installed).
    """
    if not build_env:
        return [], {}
    return ["--no-cache-dir"], {
        name: os.environ.get(name, value) for name, value in build_env.items()
    }


async def install(
    venv: Path,
    requirements: Sequence[str],
    log: Callable[[str], None],
    build_env: dict[str, str] | None = None,
) -> None:
    """Create the environment and pip install the requirements, unless its stamp says done.

    An environment without a matching stamp is a half-finished or different install, so it is
    removed and made again; the stamp is written last, only when pip succeeded.
    """
    build_options, env = pip_build(build_env or {})
    if installed(venv, requirements, env):
        log(f"{' '.join(requirements)} is already installed in {venv}")
        return
    if venv.exists():
        await asyncio.to_thread(shutil.rmtree, venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    await _run([sys.executable, "-m", "venv", str(venv)], log, f"python -m venv {venv}")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install"]
    options = ["--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
    for name, value in env.items():
        log(f"{name}={value}")
    await _run(
        [*pip, *options, *build_options, *requirements],
        log,
        f"pip install {' '.join(requirements)}",
        env,
    )
    stamp = venv / STAMP_FILE
    partial = stamp.with_suffix(".tmp")
    partial.write_text(json.dumps(_stamp(requirements, env)))
    partial.replace(stamp)


async def _run(
    argv: list[str], log: Callable[[str], None], what: str, extra_env: dict[str, str] | None = None
) -> None:
    """Run a command, each output line into the log; raise InstallError with its last lines."""
    log(f"$ {' '.join(argv)}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PIP_NO_INPUT": "1", **(extra_env or {})}
    # Its own session, so a cancelled install kills pip's compiler children too.
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    tail: collections.deque[str] = collections.deque(maxlen=_PIP_TAIL_LINES)
    assert process.stdout is not None
    try:
        async with asyncio.timeout(INSTALL_TIMEOUT_S):
            async for raw in process.stdout:
                line = raw.decode(errors="replace").rstrip()
                if line:
                    tail.append(line)
                    log(line)
            code = await process.wait()
    except TimeoutError:
        _kill_group(process)
        await process.wait()
        raise InstallError(f"{what} did not finish within {INSTALL_TIMEOUT_S:.0f} s") from None
    except BaseException:
        _kill_group(process)
        await process.wait()
        raise
    if code != 0:
        lines = "\n".join(tail)
        raise InstallError(f"{what} failed with exit code {code}:\n{lines}")


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
