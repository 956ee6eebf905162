"""Run Nexus on this machine with everything it needs: what `make run` starts."""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections, transaction
from django.db.models import Q

from nexus import embedded_redis, services
from nexus.celery import app as celery_app
from nexus.env import bundled_redis_socket, env_bool, env_list
from nexus.launcher import (
    FIRST_WAVE,
    Child,
    LaunchError,
    StopRequested,
    Supervisor,
    daphne_argv,
    http_answers,
    port_in_use,
)
from nexus.models import DEFAULT_PROJECT, ApiToken, project_named
from nexus.ports import DEFAULT_DEMO_PORTS, controller_ports
from nodes import services as node_services
from nodes.agent.config import CREDENTIAL_ENV, CREDENTIAL_FILE
from nodes.agent.identity import KEY_FILE, Identity
from nodes.agent.processes import kill_all
from nodes.client import AgentClient, AgentClientError
from nodes.models import Node, NodeTrust
from pools.models import POOL_MODEL_PREFIX
from pools.services import DEMO_ENGINES, DEMO_MODEL, DEMO_POOL_SLUG, ensure_demo_pool
from serving.demo import seed_real_model
from serving.models import models_root

ADMIN_USERNAME = "admin"
WORKER_CONCURRENCY = 2
LOCAL_NODE = "local"
# How long each runtime the local agent runs gets to exit on SIGTERM at stop, before SIGKILL.
RUNTIME_STOP_GRACE_S = 5
# Beyond its shutdown grace, how long the web server gets to write its buffers and exit.
WEB_FLUSH_S = 10
# The history writer's stop: it writes what is on the stream first (pools.history_writer).
HISTORY_WRITER_STOP_S = 15


@dataclass(frozen=True)
class FirstRun:
    """The secrets this run created; they are shown once and never stored in clear."""

    admin_password: str | None = None
    demo_token: str | None = None
    # The demo's real model (serving.demo): its service token, or why there is none.
    real_model_token: str | None = None
    real_model: str = ""


@dataclass(frozen=True)
class LocalAgent:
    """The agent this run starts here, and the data dir that holds its key and credential."""

    port: int
    data_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def credential(self) -> str | None:
        """Return the credential the agent stored in its data dir, or None before it made one."""
        try:
            return (self.data_dir / CREDENTIAL_FILE).read_text().strip() or None
        except FileNotFoundError:
            return None

    def key_fingerprint(self) -> str:
        """Return the fingerprint of the key in the agent's data dir, which must exist by now."""
        if not (self.data_dir / KEY_FILE).is_file():
            raise LaunchError(f"The local agent answers but {self.data_dir / KEY_FILE} is missing.")
        return Identity.load_or_create(self.data_dir).fingerprint

    def answers(self) -> bool:
        """Return whether the agent answers an authenticated /agent/v1/info."""
        credential = self.credential()
        if credential is None:
            return False
        try:
            with AgentClient(self.url, credential, timeout_s=1.0) as agent:
                agent.info()
        except AgentClientError:
            return False
        return True


class Command(BaseCommand):
    help = (
        "Run Nexus here: bundled Redis, web server, history writer, Celery worker with beat, the "
        "demo engines "
        "and a local agent (node 'local'). Creates the admin user and the demo pool on the "
        "first run. Ctrl-C stops all."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        """Run until a signal or a failure; either way, stop everything this run started."""
        ports = demo_ports()
        agent = LocalAgent(local_agent_port(ports), settings.DATA_DIR / "agent")
        check_ports_free(ports, agent.port)
        supervisor = Supervisor(
            cwd=settings.BASE_DIR,
            env=child_environment(),
            log_dir=settings.DATA_DIR / "logs",
            say=self.say,
        )
        supervisor.handle_signals()
        try:
            self.start_redis(supervisor)
            first_run = self.prepare_database(supervisor, ports)
            start_processes(supervisor, ports, agent, self.say)
            local = self.trust_local_agent(agent)
            supervisor.supervise()
            # Before the worker starts: /healthz says "ok" only once the worker's heartbeat
            # came, so whoever waits for it finds the banner (login, token) already written.
            self.say(banner(first_run, ports, local))
            start_worker(supervisor)
            supervisor.watch()
        except StopRequested as stop:
            self.say(f"\n{stop}: stopping Nexus...")
        except LaunchError as error:
            raise CommandError(f"{error}\nNexus stopped.") from None
        finally:
            supervisor.stop_all()
        self.say("Nexus stopped.")

    def say(self, text: str) -> None:
        """Print at once, even when stdout is a pipe (no terminal)."""
        self.stdout.write(text)
        self.stdout.flush()

    def start_redis(self, supervisor: Supervisor) -> None:
        """Start the bundled Redis server unless REDIS_URL names one."""
        if not settings.NEXUS_BUNDLED_REDIS:
            try:
                services.redis_client().ping()
            except redis.RedisError as error:
                raise LaunchError(f"Redis at REDIS_URL does not answer: {error}") from None
            self.say("Redis: the server at REDIS_URL")
            return
        socket_path = bundled_redis_socket(settings.DATA_DIR)
        try:
            process = embedded_redis.ensure(socket_path)
        except embedded_redis.BundledRedisError as error:
            raise LaunchError(str(error)) from None
        if process is None:
            self.say(f"Redis: reusing the bundled server that already answers on {socket_path}")
            return
        supervisor.adopt(
            "redis",
            process,
            socket_path.with_suffix(".log"),
            respawn=partial(embedded_redis.start, socket_path),
        )
        self.say(f"Redis: bundled server on {socket_path}")

    def prepare_database(self, supervisor: Supervisor, ports: list[int]) -> FirstRun:
        """Migrate, and seed the admin user and the demo on an empty database."""
        supervisor.check()
        call_command("migrate", interactive=False, verbosity=0)
        self.say(f"Database: {describe_database()}, migrated")
        first_run = seed_first_run(ports)
        # The launcher only watches from here on: hold no SQLite handle while others write.
        connections.close_all()
        supervisor.check()
        return first_run

    def trust_local_agent(self, agent: LocalAgent) -> str:
        """Make node `local` the agent this run started, trusted; return the banner's line."""
        credential = agent.credential()
        if credential is None:
            raise LaunchError(f"The local agent answers but {agent.data_dir} holds no credential.")
        try:
            node = ensure_local_node(agent.url, credential, agent.key_fingerprint())
        except node_services.NodeError as error:
            # Nexus runs without it; the operator can add the agent by hand.
            return f"not added: {error}"
        finally:
            connections.close_all()
        return f"{node.name}: agent on {agent.url} ({node.get_trust_display().lower()})"


def demo_ports() -> list[int]:
    """Return the demo engines' ports from NEXUS_DEMO_PORTS."""
    raw = env_list("NEXUS_DEMO_PORTS", DEFAULT_DEMO_PORTS)
    try:
        ports = [int(item) for item in raw]
    except ValueError:
        ports = []
    distinct = len({*ports, settings.NEXUS_PORT}) == len(ports) + 1
    if len(ports) != len(DEMO_ENGINES) or not distinct or not all(0 < p < 65536 for p in ports):
        raise CommandError(
            f"NEXUS_DEMO_PORTS must be {len(DEMO_ENGINES)} distinct TCP ports other than "
            f"NEXUS_PORT, e.g. {','.join(DEFAULT_DEMO_PORTS)}; got {','.join(raw)!r}."
        )
    return ports


def local_agent_port(ports: list[int]) -> int:
    """Return the local agent's port from NEXUS_AGENT_PORT."""
    port = settings.NEXUS_AGENT_PORT
    if port in (settings.NEXUS_PORT, *ports) or not 0 < port < 65536:
        raise CommandError(
            "NEXUS_AGENT_PORT must be a TCP port other than NEXUS_PORT and NEXUS_DEMO_PORTS, "
            f"e.g. 7100; got {port}."
        )
    return port


def check_ports_free(ports: list[int], agent_port: int) -> None:
    """Refuse to start when a port we need is taken, naming it and the setting that chose it."""
    wanted = [(settings.NEXUS_HOST, settings.NEXUS_PORT, "the web server (NEXUS_PORT)")]
    wanted += [
        ("127.0.0.1", port, f"demo engine {engine.name!r} (NEXUS_DEMO_PORTS)")
        for engine, port in zip(DEMO_ENGINES, ports, strict=True)
    ]
    wanted.append(("127.0.0.1", agent_port, "the local agent (NEXUS_AGENT_PORT)"))
    taken = [
        f"  {host}:{port} for {what}" for host, port, what in wanted if port_in_use(host, port)
    ]
    if taken:
        raise CommandError(
            "These ports are already in use (is Nexus already running?):\n"
            + "\n".join(taken)
            + "\nStop what holds them, or choose others with NEXUS_PORT / NEXUS_DEMO_PORTS / "
            "NEXUS_AGENT_PORT."
        )


def child_environment() -> dict[str, str]:
    """Return the environment of every child: ours, with the data dir made absolute."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "nexus.settings"),
        # A relative NEXUS_DATA_DIR would move with a child's working directory.
        "NEXUS_DATA_DIR": str(settings.DATA_DIR),
        "PYTHONUNBUFFERED": "1",
    }


def describe_database() -> str:
    """Return where the database is, without credentials."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"SQLite at {db['NAME']}"
    return f"{connection.vendor} database {db['NAME']!r} on {db['HOST'] or 'localhost'}"


@transaction.atomic
def seed_first_run(ports: list[int]) -> FirstRun:
    """On a database without an admin, create one and the demo pool with a client token."""
    user_model = get_user_model()
    if user_model.objects.filter(Q(is_superuser=True) | Q(username=ADMIN_USERNAME)).exists():
        # Not the first run: everything from here on belongs to the operator.
        return FirstRun()
    password = secrets.token_urlsafe(12)
    admin = user_model.objects.create_superuser(ADMIN_USERNAME, email="", password=password)
    _, created = ensure_demo_pool(ports)
    if not created:
        return FirstRun(admin_password=password)
    _, token = ApiToken.issue(
        "demo",
        project=project_named(DEFAULT_PROJECT),
        pools=[DEMO_POOL_SLUG],
        created_by=admin,
    )
    if not env_bool("NEXUS_DEMO_REAL_MODEL", True):
        return FirstRun(admin_password=password, demo_token=token, real_model="not offered")
    seeded = seed_real_model(admin)
    if isinstance(seeded, str):
        return FirstRun(admin_password=password, demo_token=token, real_model=seeded)
    service, secret = seeded
    described = f"{POOL_MODEL_PREFIX}{service.name}: SmolLM2-135M on llama.cpp, 1 replica"
    return FirstRun(
        admin_password=password, demo_token=token, real_model=described, real_model_token=secret
    )


def start_processes(
    supervisor: Supervisor, ports: list[int], agent: LocalAgent, say: Callable[[str], None]
) -> None:
    """Start the demo engines, the local agent and daphne; wait until each is ready."""
    python = sys.executable
    probes: list[tuple[Child, str, tuple[int, ...]]] = []
    for engine, port in zip(DEMO_ENGINES, ports, strict=True):
        argv = [
            python, "-m", "serving.runtimes.simulator", "--host", "127.0.0.1",
            "--port", str(port), "--model", DEMO_MODEL, "--ttft-ms", str(engine.ttft_ms),
            "--tpot-ms", str(engine.tpot_ms), "--concurrency", str(engine.concurrency),
        ]  # fmt: skip
        health = f"http://127.0.0.1:{port}/health"
        engine_child = supervisor.start(f"engine-{engine.name}", argv, stop_wave=FIRST_WAVE + 1)
        probes.append((engine_child, health, (200,)))
    local_agent = start_local_agent(supervisor, agent, say)
    # The web server stops first, and may take its shutdown grace: its streams finish on the
    # engines, which stop in the next wave.
    web = supervisor.start(
        "web",
        daphne_argv(settings.NEXUS_HOST, settings.NEXUS_PORT),
        stop_grace_s=settings.NEXUS_SHUTDOWN_GRACE_S + WEB_FLUSH_S,
    )
    # /healthz answers 503 while the worker's first heartbeat is due: the server is up anyway.
    probes.append((web, f"{local_url()}/healthz", (200, 503)))
    start_history_writer(supervisor)
    for child, url, statuses in probes:
        supervisor.wait_ready(child, partial(http_answers, url, statuses))
    supervisor.wait_ready(local_agent, agent.answers)


def start_history_writer(supervisor: Supervisor) -> Child:
    """Start the writer of the gateway's routing history (pools.history_writer). It stops after
    the web server, which ships its last records on the way out, and writes them before Redis
    stops."""
    return supervisor.start(
        "history-writer",
        [sys.executable, str(settings.BASE_DIR / "manage.py"), "runhistorywriter"],
        stop_wave=FIRST_WAVE + 1,
        stop_grace_s=HISTORY_WRITER_STOP_S,
    )


def start_worker(supervisor: Supervisor) -> None:
    """Start the Celery worker with beat and wait until it answers a ping."""
    # A node name of our own, so the readiness ping reaches this worker and no other.
    node = f"nexus-{os.getpid()}@{socket.gethostname()}"
    worker = supervisor.start(
        "worker",
        [sys.executable, "-m", "celery", "-A", "nexus", "worker", "--beat",
         "--concurrency", str(WORKER_CONCURRENCY), "--hostname", node,
         "--loglevel", settings.NEXUS_LOG_LEVEL,
         # One worker needs no syncing with peers; skipping it saves a second at start.
         "--without-mingle", "--without-gossip"],
        stop_wave=FIRST_WAVE + 1,
    )  # fmt: skip
    supervisor.wait_ready(
        worker, lambda: bool(celery_app.control.ping(destination=[node], timeout=0.5))
    )


def start_local_agent(
    supervisor: Supervisor, agent: LocalAgent, say: Callable[[str], None]
) -> Child:
    """Start the agent on loopback; it stops after the worker that sends it work, its runtimes
    first."""
    argv = [
        sys.executable, "-m", "nodes.agent", "--host", "127.0.0.1", "--port", str(agent.port),
        "--data-dir", str(agent.data_dir),
        # Model folders live there: the agent may serve them.
        "--allow-dir", str(models_root()),
    ]  # fmt: skip
    # Replicas it runs never get a port this run's own processes listen on.
    for port in sorted(controller_ports()):
        argv += ["--reserve-port", str(port)]
    # Its credential is the one in its data dir, where this run reads it back to add the node.
    env = {key: value for key, value in child_environment().items() if key != CREDENTIAL_ENV}
    return supervisor.start(
        "agent",
        argv,
        env=env,
        stop_wave=FIRST_WAVE + 2,
        before_stop=lambda: stop_local_runtimes(agent, say),
    )


def ensure_local_node(address: str, credential: str, fingerprint: str) -> Node:
    """Make node `local` point at the agent at address, and trust it unless it was rejected.

    Trusting without the operator is safe only here: this process started that agent and read
    `fingerprint` from the key in the agent's own data dir, and the agent must prove, by signing a
    fresh challenge, that it holds that very key.
    """
    node = Node.objects.filter(name=LOCAL_NODE).first()
    identity = node_services.prove_identity(address, credential, node=node)
    if identity.fingerprint != fingerprint:
        raise LaunchError(
            f"The agent at {address} presents the key {identity.fingerprint}, not the local "
            f"agent's {fingerprint}; another program may hold NEXUS_AGENT_PORT."
        )
    if node is None:
        node = node_services.add_node(LOCAL_NODE, address, credential)
    elif node.address != address or node.get_credential() != credential:
        node = node_services.update_node(
            node, address=address, credential=credential, identity=identity
        )
    # A rejected node stays so: the operator said no, and only they can take it back.
    if node.trust == NodeTrust.PENDING and node.fingerprint == fingerprint:
        node = node_services.confirm_node(node, fingerprint)
    return node


def stop_local_runtimes(agent: LocalAgent, say: Callable[[str], None]) -> None:
    """Stop every process the local agent runs: through the agent (SIGTERM, SIGKILL after a
    grace, all at once), then SIGKILL whatever its records still show alive.

    The agent keeps its processes when it stops, by design, and they run in sessions of their own;
    but `make run` promised to stop all it started, even when the agent died first.
    """
    credential = agent.credential()
    if credential is not None:
        with AgentClient(agent.url, credential) as client:
            try:
                running = [item for item in client.processes() if item.get("state") == "running"]
            except AgentClientError as error:
                say(f"Cannot list the local agent's runtimes: {error}")
                running = []
            if running:
                say(f"Stopping {len(running)} runtime(s) the local agent runs...")

            def stop(item: dict[str, Any]) -> None:
                try:
                    client.stop_process(str(item["id"]), grace_s=RUNTIME_STOP_GRACE_S)
                except AgentClientError as error:
                    say(f"Cannot stop {item.get('name') or item['id']}: {error}")

            with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
                list(pool.map(stop, running))
    kill_all(agent.data_dir)


def local_url() -> str:
    """Return the URL this machine reaches the web server at."""
    host = settings.NEXUS_HOST
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.NEXUS_PORT}"


def banner(first_run: FirstRun, ports: list[int], local_node: str) -> str:
    """Return what a user needs to start: URL, login, token and copy-paste examples."""
    url = local_url()
    python = os.path.relpath(sys.executable, settings.BASE_DIR)
    if python.startswith(".."):
        python = sys.executable
    model = f"{POOL_MODEL_PREFIX}{DEMO_POOL_SLUG}"
    engines = ", ".join(
        f"{engine.name} :{port}" for engine, port in zip(DEMO_ENGINES, ports, strict=True)
    )
    once = "(shown this once: keep it)"
    if first_run.admin_password:
        login = f"user {ADMIN_USERNAME}, password {first_run.admin_password}  {once}"
    else:
        login = (
            f"user {ADMIN_USERNAME} (its password was shown on the first run)\n"
            f"{'':16}new password: {python} manage.py changepassword {ADMIN_USERNAME}"
        )
    more = f"more tokens, with limits: {url}/tokens/"
    if first_run.demo_token:
        token = (
            f"{first_run.demo_token}  {once}\n"
            f"{'':16}a client token: calls {model} only (/v1), never the admin API;\n"
            f"{'':16}{more}"
        )
        export = f"export NEXUS_TOKEN={first_run.demo_token}"
    else:
        token = f"{more} (or {python} manage.py nexus_token create --name me)"
        export = "export NEXUS_TOKEN=<your token>"
    real_model = ""
    if first_run.real_model:
        real_model = f"  Real model    {first_run.real_model}\n"
    if first_run.real_model_token:
        real_model += f"                its token {first_run.real_model_token}  {once}\n"
    rule = "-" * 78
    return f"""
{rule}
  Nexus is running at {url}/
{rule}
  Sign in       {login}
  Client token  {token}
  Admin token   {python} manage.py nexus_token create --name NAME --kind admin \\
                  --scope write --user {ADMIN_USERNAME}   (for the admin API: docs/access.md)
  Demo pool     {model}: simulated {DEMO_MODEL} engines {engines}
{real_model}  Local node    {local_node}
  Health        {url}/healthz
  Logs          {settings.DATA_DIR / "logs"}/

  Try it with curl:

    {export}
    curl -N {url}/v1/chat/completions \\
      -H "Authorization: Bearer $NEXUS_TOKEN" -H "Content-Type: application/json" \\
      -d '{{"model": "{model}", "stream": true,
           "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  or with Python (pip install openai):

    import os
    from openai import OpenAI

    client = OpenAI(base_url="{url}/v1", api_key=os.environ["NEXUS_TOKEN"])
    stream = client.chat.completions.create(
        model="{model}",
        messages=[{{"role": "user", "content": "Hello!"}}],
        stream=True,
    )
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()

  Ctrl-C stops Nexus and everything it started.
{rule}"""
