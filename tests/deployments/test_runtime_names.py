"""Deployments stored under llama.cpp's former name take the catalogue's one name."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("deployments", "0001_initial")]
AFTER = [("deployments", "0002_one_runtime_name")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_renames_llama_cpp_deployments_and_nothing_else() -> None:
    # Given deployments stored before the catalogue, one of them under "llama.cpp"
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("deployments", "Deployment")
    for name, runtime in (("llama", "llama.cpp"), ("sim", "simulator")):
        old.objects.create(
            name=name, runtime=runtime, model_source="path", model_location="/m", model_name="m"
        )

    # When the migration runs
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)

    # Then the llama.cpp deployment has the catalogue's name, the other keeps its own
    new = executor.loader.project_state(AFTER).apps.get_model("deployments", "Deployment")
    stored = dict(new.objects.values_list("name", "runtime"))
    assert stored == {"llama": "llama-cpp", "sim": "simulator"}
    new.objects.all().delete()
