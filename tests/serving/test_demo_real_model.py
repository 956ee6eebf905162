"""`make run`'s demo offers the real model (SmolLM2 on llama.cpp) when it is installed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_django.fixtures import Settings

from nexus.models import ApiToken
from serving import demo
from serving.models import Service
from tests.support.real_model import require_real_model

pytestmark = [pytest.mark.django_db, pytest.mark.llama]


def test_the_first_run_declares_a_llama_cpp_service_on_smollm2_with_a_token(
    settings: Settings, tmp_path: Path
) -> None:
    gguf = require_real_model()
    settings.DATA_DIR = tmp_path

    service, secret = demo.seed_real_model(None)

    revision = service.latest_revision
    assert (service.name, service.desired_replicas, revision.runtime_variant) == (
        "smollm2",
        1,
        "llama-cpp",
    )
    assert revision.spec["model_name"] == "smollm2-135m"
    assert revision.spec["argv"][4] == f"/models/{gguf.name}"
    assert (revision.model_folder.path / gguf.name).stat().st_size == gguf.stat().st_size
    assert list(ApiToken.objects.values_list("name", "services")) == [("demo", ["smollm2"])]
    assert secret
    # A second run leaves the operator's service alone.
    assert demo.seed_real_model(None) == "the service smollm2 exists already"
    assert Service.objects.count() == 1
