"""docker-compose.yml describes the production stack: databases first, then Nexus's processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
NEXUS_SERVICES = ["migrate", "web", "history-writer", "worker", "beat"]


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    return compose["services"]


def test_it_runs_postgres_redis_and_the_nexus_processes(services: dict[str, Any]) -> None:
    assert set(services) == {"postgres", "redis", *NEXUS_SERVICES}


def test_each_nexus_process_runs_its_own_command(services: dict[str, Any]) -> None:
    assert services["migrate"]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert services["web"]["command"][0] == "daphne"
    assert services["web"]["command"][-1] == "nexus.asgi:application"
    assert services["history-writer"]["command"] == ["python", "manage.py", "runhistorywriter"]
    assert services["worker"]["command"][:4] == ["celery", "-A", "nexus", "worker"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "nexus", "beat"]
    # Beat runs as its own service, never embedded in a worker that may be scaled out.
    assert "-B" not in services["worker"]["command"]
    assert "--beat" not in services["worker"]["command"]


def test_the_nexus_processes_share_one_environment(services: dict[str, Any]) -> None:
    environments = [services[name]["environment"] for name in NEXUS_SERVICES]

    assert all(environment == environments[0] for environment in environments)
    assert environments[0]["DATABASE_URL"].startswith("postgres://")
    assert environments[0]["REDIS_URL"] == "redis://redis:6379/0"
    assert environments[0]["NEXUS_SECRET_KEY"].startswith("${NEXUS_SECRET_KEY:?")
    assert environments[0]["NEXUS_ENCRYPTION_KEY"].startswith("${NEXUS_ENCRYPTION_KEY:?")


@pytest.mark.parametrize("name", ["postgres", "redis", "web", "worker"])
def test_long_running_services_have_a_health_check(services: dict[str, Any], name: str) -> None:
    healthcheck = services[name]["healthcheck"]

    assert healthcheck["test"][0] in {"CMD", "CMD-SHELL"}
    assert healthcheck["interval"]
    assert healthcheck["retries"] >= 3


def test_the_web_health_check_calls_healthz(services: dict[str, Any]) -> None:
    assert "http://127.0.0.1:8000/healthz" in " ".join(services["web"]["healthcheck"]["test"])


@pytest.mark.parametrize("name", ["web", "history-writer", "worker", "beat"])
def test_nexus_processes_wait_for_healthy_databases_and_a_migrated_schema(
    services: dict[str, Any], name: str
) -> None:
    assert services[name]["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }


def test_migrations_wait_for_a_healthy_postgres_and_run_once(services: dict[str, Any]) -> None:
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["migrate"]["restart"] == "no"


def test_the_image_is_python_311_slim_with_nexus_installed() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()

    assert "FROM python:3.11-slim" in dockerfile
    assert "pip install --constraint requirements/constraints.txt ." in dockerfile
