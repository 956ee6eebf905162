"""The command importer: every alias, the docker wrapper, quoting, continuations and errors."""

from __future__ import annotations

import pytest

from serving.definitions import CommandImportError, ImportedCommand, import_command

# Port


@pytest.mark.parametrize(
    ("line", "port"),
    [
        ("vllm serve /models/m", 8000),
        ("vllm serve /models/m --port 9000", 9000),
        ("vllm serve /models/m --port=9000", 9000),
        ("vllm serve /models/m -p 9000", 9000),
        ("vllm serve /models/m -p=9000", 9000),
        ("vllm serve /models/m --port 9000 --port 9001", 9001),
        ("python3 -m sglang.launch_server --model-path /models/m", 30000),
        ("python3 -m sglang.launch_server --model-path /models/m --port 9001", 9001),
        ("llama-server -m /models/m.gguf", 8080),
        ("max serve --model-path /models/m", 8000),
        ("MAX_SERVE_PORT=8100 max serve --model-path /models/m", 8100),
        ("python -m serving.runtimes.simulator --model demo", 9101),
        ("./serve.sh", 8000),
        ("./serve.sh --port 7000", 7000),
        ("vllm serve /models/m --port ${PORT}", 8000),
        ("vllm serve /models/m --port '$PORT'", 8000),
    ],
    ids=lambda value: str(value),
)
def test_the_port_comes_from_any_alias_else_the_servers_default(line, port):
    assert import_command(line).port == port


# Parallel sizes


TENSOR_ALIASES = ["--tensor-parallel-size", "--tp", "-tp", "--tp-size"]
PIPELINE_ALIASES = ["--pipeline-parallel-size", "--pp", "-pp", "--pp-size"]


@pytest.mark.parametrize("alias", TENSOR_ALIASES)
@pytest.mark.parametrize("joiner", [" ", "="], ids=["space", "equals"])
def test_every_tensor_parallel_alias_is_read(alias, joiner):
    imported = import_command(f"vllm serve /models/m {alias}{joiner}4")

    assert (imported.tensor_parallel_size, imported.pipeline_parallel_size) == (4, None)


@pytest.mark.parametrize("alias", PIPELINE_ALIASES)
@pytest.mark.parametrize("joiner", [" ", "="], ids=["space", "equals"])
def test_every_pipeline_parallel_alias_is_read(alias, joiner):
    imported = import_command(f"python3 -m sglang.launch_server --model-path /m {alias}{joiner}2")

    assert (imported.tensor_parallel_size, imported.pipeline_parallel_size) == (None, 2)


def test_both_sizes_together():
    imported = import_command("vllm serve /models/m -tp 8 -pp 2")

    assert (imported.tensor_parallel_size, imported.pipeline_parallel_size) == (8, 2)


# Runtime, model path, served name and argv


@pytest.mark.parametrize(
    ("line", "runtime", "model_path", "served_name"),
    [
        ("vllm serve /models/my-model --tp 2", "vllm", "/models/my-model", None),
        ("vllm serve --model /models/a --served-model-name chat", "vllm", "/models/a", "chat"),
        ("vllm serve /models/a --served-model-name=chat", "vllm", "/models/a", "chat"),
        (
            "python -m vllm.entrypoints.openai.api_server --model /models/a",
            "vllm",
            "/models/a",
            None,
        ),
        (
            "python3.11 -m vllm.entrypoints.openai.api_server --model=/models/a",
            "vllm",
            "/models/a",
            None,
        ),
        (
            "/opt/venv/bin/python -m sglang.launch_server --model-path /models/b "
            "--served-model-name b-chat",
            "sglang",
            "/models/b",
            "b-chat",
        ),
        ("python3 -m sglang.launch_server --model /models/b", "sglang", "/models/b", None),
        ("llama-server -m /models/c.gguf --alias tiny", "llama-cpp", "/models/c.gguf", "tiny"),
        (
            "/usr/local/bin/llama-server --model /models/c.gguf -a tiny",
            "llama-cpp",
            "/models/c.gguf",
            "tiny",
        ),
        ("max serve --model-path /models/d", "modular-max", "/models/d", None),
        ("max serve --model /models/d --served-model-name d", "modular-max", "/models/d", "d"),
        ("python -m serving.runtimes.simulator --model demo-8b", "simulator", None, "demo-8b"),
        ("/opt/nim/start_server.sh", "nim", None, None),
        ("NIM_SERVED_MODEL_NAME=llm /opt/nim/start_server.sh", "nim", None, "llm"),
        ("python app.py --model /models/e", "custom", "/models/e", None),
        (
            "python -m llama_cpp.server --model /models/f --model_alias t",
            "llama-cpp",
            "/models/f",
            "t",
        ),
        ("text-generation-launcher --model-id x", "custom", None, None),
    ],
    ids=lambda value: str(value)[:40],
)
def test_the_runtime_model_path_and_served_name_are_recognised(
    line, runtime, model_path, served_name
):
    imported = import_command(line)

    assert (imported.runtime, imported.model_path, imported.served_model_name) == (
        runtime,
        model_path,
        served_name,
    )


@pytest.mark.parametrize(
    ("runtime", "health_path"),
    [
        ("vllm serve /m", "/health"),
        ("python3 -m sglang.launch_server --model-path /m", "/health"),
        ("/opt/nim/start_server.sh", "/v1/health/ready"),
        ("max serve --model-path /m", "/health"),
        # llama-cpp-python's server has no /health; the C++ llama-server has.
        ("python -m llama_cpp.server --model /m", "/openapi.json"),
        ("llama-server -m /m", "/health"),
        ("./custom-server", "/health"),
    ],
)
def test_the_health_path_is_the_variants(runtime, health_path):
    assert import_command(runtime).health_path == health_path


def test_a_plain_command_is_kept_whole_as_argv():
    imported = import_command("vllm serve /models/my-model --tp 2")

    assert imported == ImportedCommand(
        runtime="vllm",
        port=8000,
        health_path="/health",
        mount="/models",
        model_path="/models/my-model",
        served_model_name=None,
        tensor_parallel_size=2,
        pipeline_parallel_size=None,
        env={},
        argv=("vllm", "serve", "/models/my-model", "--tp", "2"),
        image=None,
        warnings=(),
    )


def test_leading_assignments_become_variables():
    imported = import_command("CUDA_VISIBLE_DEVICES=0,1 HF_HOME=/cache env A= vllm serve /m")

    assert dict(imported.env) == {"CUDA_VISIBLE_DEVICES": "0,1", "HF_HOME": "/cache", "A": ""}
    assert imported.argv == ("vllm", "serve", "/m")


def test_a_pasted_prompt_and_sudo_are_dropped():
    assert import_command("$ sudo vllm serve /m").argv == ("vllm", "serve", "/m")


# Quoting and continuation


@pytest.mark.parametrize(
    ("line", "argv"),
    [
        (
            "vllm serve '/models/my model' --served-model-name \"my chat\"",
            ("vllm", "serve", "/models/my model", "--served-model-name", "my chat"),
        ),
        ("vllm serve /models/my\\ model", ("vllm", "serve", "/models/my model")),
        (
            "vllm serve /m --chat-template='{{ messages }}'",
            ("vllm", "serve", "/m", "--chat-template={{ messages }}"),
        ),
        (
            "vllm serve /m \\\n  --tp 2 \\\n  --port 9000",
            ("vllm", "serve", "/m", "--tp", "2", "--port", "9000"),
        ),
        (
            "vllm serve /m \\\r\n  --tp 2",
            ("vllm", "serve", "/m", "--tp", "2"),
        ),
        ("vllm serve /m\n--tp 2\n", ("vllm", "serve", "/m", "--tp", "2")),
        ("  vllm   serve\t/m  ", ("vllm", "serve", "/m")),
    ],
    ids=[
        "quoted-words",
        "escaped-space",
        "quoted-value",
        "continuations",
        "crlf-continuation",
        "bare-newlines",
        "extra-blanks",
    ],
)
def test_the_line_is_split_like_a_shell_splits_it(line, argv):
    assert import_command(line).argv == argv


def test_quoted_values_reach_the_fields():
    imported = import_command(
        "vllm serve --model='/models/a b' --served-model-name 'a b' --port \"9000\""
    )

    assert (imported.model_path, imported.served_model_name, imported.port) == (
        "/models/a b",
        "a b",
        9000,
    )


def test_several_served_names_keep_the_first_with_a_warning():
    imported = import_command("vllm serve /models/m --served-model-name chat chat-v1 --tp 2")

    assert imported.served_model_name == "chat"
    assert imported.tensor_parallel_size == 2
    assert imported.warnings == ("--served-model-name: using 'chat'; other names ignored: chat-v1",)


# sh -c


def test_a_one_command_shell_script_is_unwrapped():
    imported = import_command("sh -c 'HF_HUB_OFFLINE=1 vllm serve /models/m --port 8001'")

    assert imported.argv == ("vllm", "serve", "/models/m", "--port", "8001")
    assert dict(imported.env) == {"HF_HUB_OFFLINE": "1"}
    assert imported.port == 8001


def test_a_longer_shell_script_is_kept_and_its_last_command_recognised():
    line = 'bash -lc "pip install -U vllm && vllm serve /models/m --tp 2"'

    imported = import_command(line)

    assert imported.argv == ("bash", "-lc", "pip install -U vllm && vllm serve /models/m --tp 2")
    assert (imported.runtime, imported.tensor_parallel_size) == ("vllm", 2)


# docker run


@pytest.mark.parametrize(
    ("line", "runtime", "argv", "image"),
    [
        (
            "docker run --gpus all vllm/vllm-openai --model /models/m",
            "vllm",
            ("vllm", "serve", "--model", "/models/m"),
            "vllm/vllm-openai",
        ),
        (
            "docker run vllm/vllm-openai:v0.8.5 /models/m --tp 2",
            "vllm",
            ("vllm", "serve", "/models/m", "--tp", "2"),
            "vllm/vllm-openai:v0.8.5",
        ),
        (
            "docker run docker.io/vllm/vllm-openai@sha256:abc --model /m",
            "vllm",
            ("vllm", "serve", "--model", "/m"),
            "docker.io/vllm/vllm-openai@sha256:abc",
        ),
        (
            "docker run lmsysorg/sglang:latest python3 -m sglang.launch_server --model-path /m",
            "sglang",
            ("python3", "-m", "sglang.launch_server", "--model-path", "/m"),
            "lmsysorg/sglang:latest",
        ),
        (
            "docker run lmsysorg/sglang bash -c 'python3 -m sglang.launch_server --model-path /m'",
            "sglang",
            ("python3", "-m", "sglang.launch_server", "--model-path", "/m"),
            "lmsysorg/sglang",
        ),
        (
            "docker run nvcr.io/nim/meta/llama-3.1-8b-instruct:1.0.0",
            "nim",
            ("/opt/nim/start_server.sh",),
            "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.0.0",
        ),
        (
            "docker run modular/max-nvidia-full:latest --model-path /models/g",
            "modular-max",
            ("max", "serve", "--model-path", "/models/g"),
            "modular/max-nvidia-full:latest",
        ),
        (
            "docker run ghcr.io/ggml-org/llama.cpp:server -m /models/t.gguf --port 8080",
            "llama-cpp",
            ("llama-server", "-m", "/models/t.gguf", "--port", "8080"),
            "ghcr.io/ggml-org/llama.cpp:server",
        ),
        (
            "docker run --entrypoint vllm myorg/inference:1 serve /models/m",
            "vllm",
            ("vllm", "serve", "/models/m"),
            "myorg/inference:1",
        ),
        (
            "podman run vllm/vllm-openai --model /m",
            "vllm",
            ("vllm", "serve", "--model", "/m"),
            "vllm/vllm-openai",
        ),
        (
            "docker container run vllm/vllm-openai --model /m",
            "vllm",
            ("vllm", "serve", "--model", "/m"),
            "vllm/vllm-openai",
        ),
    ],
    ids=[
        "vllm-image",
        "vllm-tag-positional-model",
        "vllm-registry-digest",
        "sglang-image",
        "sglang-bash-c",
        "nim-image",
        "max-image",
        "llama-cpp-image",
        "entrypoint",
        "podman",
        "container-run",
    ],
)
def test_docker_run_is_unwrapped_to_the_servers_command(line, runtime, argv, image):
    imported = import_command(line)

    assert (imported.runtime, imported.argv, imported.image) == (runtime, argv, image)


def test_a_full_docker_line_fills_every_field():
    line = """docker run --runtime nvidia --gpus all \\
        -v ~/.cache/huggingface:/root/.cache/huggingface \\
        -v /srv/models/llama:/models:ro \\
        --env "HUGGING_FACE_HUB_TOKEN=hf_x" -e VLLM_LOGGING_LEVEL=DEBUG --env=A=1 \\
        -p 8000:8000 --ipc=host --rm -it \\
        vllm/vllm-openai:latest \\
        --model /models/llama --served-model-name llama -tp 2 --pipeline-parallel-size=2"""

    imported = import_command(line)

    assert imported.to_dict() == {
        "runtime": "vllm",
        "port": 8000,
        "health_path": "/health",
        "mount": "/models",
        "model_path": "/models/llama",
        "served_model_name": "llama",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 2,
        "env": {"HUGGING_FACE_HUB_TOKEN": "hf_x", "VLLM_LOGGING_LEVEL": "DEBUG", "A": "1"},
        "argv": [
            *("vllm", "serve", "--model", "/models/llama", "--served-model-name", "llama"),
            *("-tp", "2", "--pipeline-parallel-size=2"),
        ],
        "command_line": (
            "vllm serve --model /models/llama --served-model-name llama -tp 2 "
            "--pipeline-parallel-size=2"
        ),
        "image": "vllm/vllm-openai:latest",
        "warnings": ["docker options ignored: --runtime nvidia, --gpus all, --ipc host, --rm, -it"],
    }


@pytest.mark.parametrize(
    ("options", "env"),
    [
        ("-e A=1", {"A": "1"}),
        ("--env A=1", {"A": "1"}),
        ("--env=A=1", {"A": "1"}),
        ("-eA=1", {"A": "1"}),
        ("-e 'A=a b=c'", {"A": "a b=c"}),
        ("-e A=1 -e A=2", {"A": "2"}),
        ("-e A= ", {"A": ""}),
    ],
    ids=["-e", "--env", "--env=", "-eK=V", "quoted", "last-wins", "empty"],
)
def test_docker_variables_in_every_form(options, env):
    assert dict(import_command(f"docker run {options} vllm/vllm-openai /m").env) == env


@pytest.mark.parametrize(
    ("options", "model", "mount"),
    [
        ("", "/models/m", "/models"),
        ("-v /srv/llama:/models", "/models/m", "/models"),
        ("--volume /srv/llama:/weights:ro", "/weights/m", "/weights"),
        ("--volume=/srv/llama:/weights", "/weights/m", "/weights"),
        ("-v/srv/llama:/weights", "/weights/m", "/weights"),
        ("--mount type=bind,source=/srv/llama,target=/weights", "/weights/m", "/weights"),
        ("--mount type=bind,src=/srv/llama,dst=/weights,readonly", "/weights/m", "/weights"),
        ("-v /cache:/root/.cache -v /srv/llama:/weights", "/weights/m", "/weights"),
        ("-v /srv/llama:/weights", "org/model", "/weights"),
        ("-v named-volume:/weights", "/weights/m", "/weights"),
    ],
    ids=[
        "default",
        "-v",
        "--volume-ro",
        "--volume=",
        "-vPATH",
        "--mount-target",
        "--mount-dst",
        "the-one-holding-the-model",
        "hub-model-id",
        "named-volume",
    ],
)
def test_the_mount_is_the_volume_that_holds_the_model(options, model, mount):
    imported = import_command(f"docker run {options} vllm/vllm-openai {model}")

    assert imported.mount == mount
    assert imported.warnings == ()


@pytest.mark.parametrize(
    ("options", "args", "port"),
    [
        ("-p 8000:8000", "", 8000),
        ("-p 127.0.0.1:8000:8000/tcp", "", 8000),
        ("--publish=8000", "", 8000),
        ("-p8000:8000", "", 8000),
        ("-p 9999:8000", "", 8000),
        ("-p 9001:9001", "--port 9001", 9001),
    ],
    ids=["mapping", "ip-and-protocol", "--publish=", "-pN", "host-differs", "server-port"],
)
def test_dockers_p_maps_to_the_container_port_not_the_server_option(options, args, port):
    imported = import_command(f"docker run {options} vllm/vllm-openai /models/m {args}")

    assert imported.port == port
    assert imported.warnings == ()


def test_a_custom_image_takes_the_published_container_port():
    imported = import_command("docker run -p 8080:7000 myorg/server:1 serve")

    assert imported.port == 7000
    assert imported.runtime == "custom"


def test_nim_reads_its_port_and_name_from_its_variables():
    imported = import_command(
        "docker run -e NIM_SERVER_PORT=9000 -e NIM_SERVED_MODEL_NAME=llm -p 9000:9000 "
        "nvcr.io/nim/meta/llama3-8b-instruct:latest"
    )

    assert (imported.runtime, imported.port, imported.served_model_name) == ("nim", 9000, "llm")


# Warnings for what was not used


@pytest.mark.parametrize(
    ("line", "warnings"),
    [
        (
            "docker run -p 8080:8080 vllm/vllm-openai /models/m",
            ("docker publishes container port 8080 but the server listens on 8000; using 8000",),
        ),
        (
            "docker run -e HF_TOKEN vllm/vllm-openai /models/m",
            ("-e HF_TOKEN ignored: it passes a variable from your shell, which Nexus cannot see",),
        ),
        (
            "docker run --shm-size 16g --ulimit memlock=-1 -d vllm/vllm-openai /models/m",
            ("docker options ignored: --shm-size 16g, --ulimit memlock=-1, -d",),
        ),
        (
            "docker run --future-flag vllm/vllm-openai /models/m",
            ("docker options ignored: --future-flag",),
        ),
        (
            "docker run -p 8000-8001:8000-8001 vllm/vllm-openai /models/m",
            ("-p 8000-8001:8000-8001 ignored: not a single container port",),
        ),
        (
            "docker run -v /a:/cache -v /b:/other vllm/vllm-openai org/model",
            ("several volumes are mounted; /cache is taken as the model folder's mount",),
        ),
        (
            "vllm serve /data/llama",
            ("the model path /data/llama is not under the mount /models",),
        ),
        (
            "docker run myorg/server:1 serve",
            (
                "the image myorg/server:1 is not one Nexus knows; "
                "only the command after it was kept",
            ),
        ),
        (
            "docker run myorg/server:1",
            ("the image myorg/server:1 is not one Nexus knows and no command follows it",),
        ),
        ("docker run lmsysorg/sglang", ("the image lmsysorg/sglang was given no command to run",)),
    ],
    ids=[
        "published-port-differs",
        "env-from-shell",
        "ignored-options",
        "unknown-option",
        "port-range",
        "several-volumes",
        "model-outside-mount",
        "unknown-image",
        "unknown-image-no-command",
        "image-without-command",
    ],
)
def test_what_is_not_used_is_a_warning(line, warnings):
    assert import_command(line).warnings == warnings


# Errors


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("vllm serve '/models/m", "unbalanced quote: a quote is opened and never closed"),
        ('vllm serve "/models/m', "unbalanced quote: a quote is opened and never closed"),
        ("vllm serve /models/m \\", "the command ends with a lone backslash"),
        ("", "the command is empty"),
        ("   \n  ", "the command is empty"),
        ("$", "the command is empty"),
        ("A=1 B=2", "the command sets variables but runs nothing"),
        ("vllm serve /m --tp two", "--tp must be a positive integer, not 'two'"),
        ("vllm serve /m -tp 0", "-tp must be a positive integer, not '0'"),
        (
            "vllm serve /m --tensor-parallel-size=1.5",
            "--tensor-parallel-size must be a positive integer, not '1.5'",
        ),
        ("vllm serve /m --tp-size -2", "--tp-size must be a positive integer, not '-2'"),
        ("vllm serve /m -pp x", "-pp must be a positive integer, not 'x'"),
        ("vllm serve /m -pp ²", "-pp must be a positive integer, not '²'"),
        (
            "vllm serve /m --port ８０００",
            "--port must be a port number between 1 and 65535, not '８０００'",
        ),
        ("vllm serve /m --pp-size=", "--pp-size must be a positive integer, not ''"),
        ("vllm serve /m --tp", "--tp needs a value"),
        ("vllm serve /m --port", "--port needs a value"),
        ("vllm serve /m --port abc", "--port must be a port number between 1 and 65535, not 'abc'"),
        ("vllm serve /m -p 0", "-p must be a port number between 1 and 65535, not '0'"),
        (
            "vllm serve /m --port=65536",
            "--port must be a port number between 1 and 65535, not '65536'",
        ),
        (
            "docker run -e NIM_SERVER_PORT=x nvcr.io/nim/a/b",
            "NIM_SERVER_PORT must be a port number between 1 and 65535, not 'x'",
        ),
        ("docker run --rm -it", "docker run needs an image to run"),
        ("docker run -e", "docker option -e needs a value"),
        ("docker run -it -p", "docker option -p needs a value"),
        ("sh -c 'vllm serve \"/m'", "unbalanced quote in the sh -c script"),
        ("sh -c ' ; '", "the sh -c script is empty"),
    ],
    ids=lambda value: value[:40],
)
def test_a_command_that_cannot_be_read_says_why(line, message):
    with pytest.raises(CommandImportError) as caught:
        import_command(line)

    assert str(caught.value) == message


def test_docker_ps_is_not_unwrapped():
    imported = import_command("docker ps -a")

    assert (imported.runtime, imported.argv, imported.image) == (
        "custom",
        ("docker", "ps", "-a"),
        None,
    )


def test_the_command_line_quotes_what_needs_it():
    imported = import_command("vllm serve '/models/my model' --port ${PORT}")

    assert imported.command_line == "vllm serve '/models/my model' --port '${PORT}'"
