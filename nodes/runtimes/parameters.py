"""Runtime parameters: the launcher's vLLM and SGLang tabs, each field one real flag of the server.

Pure. A parameter's value arrives as text (a form field, a JSON string); `check_values` refuses
what the server would refuse, naming the parameter, and `flags` turns the values into arguments.
Every flag was checked against the pinned version's own argument definitions, recorded in
`flags/<runtime>-<version>.txt` (tests/nodes/test_runtime_parameters.py keeps them in step).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Kind = Literal["text", "int", "float", "bool", "choice"]
FLAGS_DIR = Path(__file__).resolve().parent / "flags"
# Quantization methods, parser names and the like: one word of letters, digits, '_', '-', '.'.
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_TRUE = frozenset({"true", "on", "1", "yes"})
_FALSE = frozenset({"false", "off", "0", "no"})
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


class ParameterError(ValueError):
    """A value the server would refuse; `key` names the parameter."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class Parameter:
    """One launcher field: its tab, the flag it becomes and the values it takes.

    `negative_flag` is the flag that turns a boolean off where the server has one (vLLM's
    `--no-<name>`); without one, off means the flag is left out.
    """

    key: str
    label: str
    tab: str
    flag: str
    kind: Kind = "text"
    help: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    negative_flag: str | None = None
    placeholder: str = ""

    def check(self, raw: str) -> str:
        """Return the value as the flag takes it; raise ParameterError when it cannot."""
        value = raw.strip()
        if self.kind == "bool":
            lowered = value.lower()
            if lowered in _TRUE:
                return "true"
            if lowered in _FALSE:
                return "false"
            raise ParameterError(self.key, f"must be true or false, not {raw!r}")
        if self.kind == "choice":
            if value not in self.choices:
                raise ParameterError(
                    self.key, f"must be one of: {', '.join(self.choices)}; not {raw!r}"
                )
            return value
        if self.kind in ("int", "float"):
            return self._number(value, raw)
        if self.key in WORD_KEYS and not _WORD.fullmatch(value):
            raise ParameterError(
                self.key, f"must be one word (letters, digits, _ - .), not {raw!r}"
            )
        if "\x00" in value:
            raise ParameterError(self.key, "must not contain a NUL character")
        return value

    def _number(self, value: str, raw: str) -> str:
        noun = "an integer" if self.kind == "int" else "a number"
        refused = ParameterError(self.key, f"must be {noun}{self._bounds()}, not {raw!r}")
        # int() and float() also read digits of other scripts; a flag's value must be ASCII.
        if not value.isascii():
            raise refused
        try:
            number: float = int(value) if self.kind == "int" else float(value)
        except ValueError:
            raise refused from None
        if not math.isfinite(number):
            raise refused
        if (self.minimum is not None and number < self.minimum) or (
            self.maximum is not None and number > self.maximum
        ):
            raise refused
        return str(number) if self.kind == "int" else value

    def _bounds(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f" from {self.minimum:g} to {self.maximum:g}"
        if self.minimum is not None:
            return f" of at least {self.minimum:g}"
        return ""

    def to_dict(self) -> dict[str, Any]:
        """Return the parameter as JSON-ready values (for the launcher and the API)."""
        return {
            "key": self.key,
            "label": self.label,
            "tab": self.tab,
            "flag": self.flag,
            "kind": self.kind,
            "help": self.help,
            "choices": list(self.choices),
            "minimum": self.minimum,
            "maximum": self.maximum,
        }


# Keys whose value is one word: a method or parser name, never a sentence.
WORD_KEYS = frozenset({"quantization", "tool_call_parser", "reasoning_parser"})


@dataclass(frozen=True)
class ParameterTable:
    """A runtime's parameters in tab order, and the server version their flags were checked
    against (`flags/<runtime>-<version>.txt`)."""

    runtime: str
    version: str
    tabs: tuple[str, ...]
    parameters: tuple[Parameter, ...]
    by_key: Mapping[str, Parameter] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_key", {p.key: p for p in self.parameters})

    @property
    def flags_file(self) -> Path:
        """Return the recorded flag names of the pinned version."""
        return FLAGS_DIR / f"{self.runtime}-{self.version}.txt"

    def in_tab(self, tab: str) -> tuple[Parameter, ...]:
        """Return the parameters of one tab, in order."""
        return tuple(p for p in self.parameters if p.tab == tab)

    def check_values(self, values: Mapping[str, Any]) -> dict[str, str]:
        """Return the set values, checked; raise ParameterError at the first unusable one.

        Empty values mean "the server's default" and are left out.
        """
        checked: dict[str, str] = {}
        for key, raw in values.items():
            parameter = self.by_key.get(key)
            if parameter is None:
                known = ", ".join(self.by_key)
                raise ParameterError(key, f"unknown parameter for {self.runtime}; known: {known}")
            if not isinstance(raw, str):
                raise ParameterError(key, 'must be a string (quote numbers: "0.9")')
            if raw.strip():
                checked[key] = parameter.check(raw)
        return checked

    def flags(self, values: Mapping[str, str]) -> list[str]:
        """Return the arguments of checked values, in table order."""
        argv: list[str] = []
        for parameter in self.parameters:
            value = values.get(parameter.key)
            if value is None or parameter.key in COMMAND_KEYS:
                continue
            if parameter.kind == "bool":
                flag = parameter.flag if value == "true" else parameter.negative_flag
                if flag is not None:
                    argv.append(flag)
            else:
                argv += [parameter.flag, value]
        return argv

    def all_flags(self) -> list[str]:
        """Return every flag the table can produce, negative ones included."""
        found = []
        for parameter in self.parameters:
            found.append(parameter.flag)
            if parameter.negative_flag:
                found.append(parameter.negative_flag)
        return found


# Model Loading's model and served name take the places the command already has for them.
COMMAND_KEYS = frozenset({"model", "served_model_name"})

MODEL_LOADING = "Model Loading"
RESOURCE_MEMORY = "Resource Memory"
SERVING_PERFORMANCE = "Serving Performance"
MULTIMODAL = "Multimodal"
TOOL_REASONING = "Tool Reasoning"


def _vllm_bool(key: str, label: str, tab: str, help: str) -> Parameter:
    flag = "--" + key.replace("_", "-")
    return Parameter(key, label, tab, flag, "bool", help, negative_flag="--no-" + flag[2:])


VLLM_PARAMETERS = ParameterTable(
    runtime="vllm",
    version="0.33.0",
    tabs=(MODEL_LOADING, RESOURCE_MEMORY, SERVING_PERFORMANCE, MULTIMODAL, TOOL_REASONING),
    parameters=(
        Parameter(
            "model",
            "Model",
            MODEL_LOADING,
            "--model",
            help="Name or path of the model (default: the model folder's mount).",
            placeholder="/models",
        ),
        Parameter(
            "dtype", "DType", MODEL_LOADING, "--dtype", "choice", "Weights and activations.", DTYPES
        ),
        Parameter(
            "quantization",
            "Quantization",
            MODEL_LOADING,
            "--quantization",
            help="Quantization method, e.g. awq, gptq, fp8.",
            placeholder="awq",
        ),
        Parameter(
            "max_model_len",
            "Max Model Length",
            MODEL_LOADING,
            "--max-model-len",
            "int",
            "Context length in tokens (default: from the model's config).",
            minimum=1,
        ),
        Parameter(
            "served_model_name",
            "Served Model Name",
            MODEL_LOADING,
            "--served-model-name",
            help="The model name the API serves (default: BACKEND_MODEL_NAME or the folder's).",
        ),
        _vllm_bool(
            "trust_remote_code", "Trust Remote Code", MODEL_LOADING, "Run the model's own code."
        ),
        Parameter(
            "gpu_memory_utilization",
            "GPU Memory Utilization",
            RESOURCE_MEMORY,
            "--gpu-memory-utilization",
            "float",
            "Share of each GPU's memory vLLM may use, 0 to 1.",
            minimum=0.01,
            maximum=1,
        ),
        Parameter(
            "kv_cache_dtype",
            "KV Cache DType",
            RESOURCE_MEMORY,
            "--kv-cache-dtype",
            "choice",
            "Data type of the KV cache.",
            ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"),
        ),
        Parameter(
            "cpu_offload_gb",
            "CPU Offload (GiB)",
            RESOURCE_MEMORY,
            "--cpu-offload-gb",
            "float",
            "GiB of weights kept in CPU memory per GPU.",
            minimum=0,
        ),
        _vllm_bool(
            "enforce_eager", "Enforce Eager", RESOURCE_MEMORY, "No CUDA graphs: less memory."
        ),
        Parameter(
            "max_num_seqs",
            "Max Running Sequences",
            SERVING_PERFORMANCE,
            "--max-num-seqs",
            "int",
            "Requests one replica runs at once (vLLM's default: 128).",
            minimum=1,
        ),
        Parameter(
            "max_num_batched_tokens",
            "Max Batched Tokens",
            SERVING_PERFORMANCE,
            "--max-num-batched-tokens",
            "int",
            "Tokens one scheduler step may process.",
            minimum=1,
        ),
        _vllm_bool(
            "enable_prefix_caching",
            "Prefix Caching",
            SERVING_PERFORMANCE,
            "Reuse the KV cache of shared prompt prefixes.",
        ),
        _vllm_bool(
            "enable_chunked_prefill",
            "Chunked Prefill",
            SERVING_PERFORMANCE,
            "Split long prompts into chunks batched with decoding.",
        ),
        Parameter(
            "limit_mm_per_prompt",
            "Items per Prompt",
            MULTIMODAL,
            "--limit-mm-per-prompt",
            help='Most items of each kind per prompt, as JSON: {"image": 4, "video": 1}.',
            placeholder='{"image": 4}',
        ),
        Parameter(
            "allowed_local_media_path",
            "Allowed Local Media Path",
            MULTIMODAL,
            "--allowed-local-media-path",
            help="A directory requests may read images and videos from (trusted setups only).",
        ),
        _vllm_bool(
            "enable_auto_tool_choice",
            "Auto Tool Choice",
            TOOL_REASONING,
            "Let the model decide when to call tools (needs a tool-call parser).",
        ),
        Parameter(
            "tool_call_parser",
            "Tool-Call Parser",
            TOOL_REASONING,
            "--tool-call-parser",
            help="How tool calls are read from the output, e.g. hermes, llama3_json.",
            placeholder="hermes",
        ),
        Parameter(
            "reasoning_parser",
            "Reasoning Parser",
            TOOL_REASONING,
            "--reasoning-parser",
            help="How reasoning is split from the answer, e.g. deepseek_r1, qwen3.",
            placeholder="deepseek_r1",
        ),
    ),
)

SGLANG_PARAMETERS = ParameterTable(
    runtime="sglang",
    version="0.5.23",
    tabs=(MODEL_LOADING, RESOURCE_MEMORY, SERVING_PERFORMANCE, TOOL_REASONING),
    parameters=(
        Parameter(
            "model",
            "Model",
            MODEL_LOADING,
            "--model-path",
            help="Name or path of the model (default: the model folder's mount).",
            placeholder="/models",
        ),
        Parameter(
            "dtype", "DType", MODEL_LOADING, "--dtype", "choice", "Weights and activations.", DTYPES
        ),
        Parameter(
            "quantization",
            "Quantization",
            MODEL_LOADING,
            "--quantization",
            help="Quantization method, e.g. awq, gptq, fp8.",
            placeholder="awq",
        ),
        Parameter(
            "context_length",
            "Context Length",
            MODEL_LOADING,
            "--context-length",
            "int",
            "Context length in tokens (default: from the model's config).",
            minimum=1,
        ),
        Parameter(
            "served_model_name",
            "Served Model Name",
            MODEL_LOADING,
            "--served-model-name",
            help="The model name the API serves (default: BACKEND_MODEL_NAME or the folder's).",
        ),
        Parameter(
            "trust_remote_code",
            "Trust Remote Code",
            MODEL_LOADING,
            "--trust-remote-code",
            "bool",
            "Run the model's own code.",
        ),
        Parameter(
            "mem_fraction_static",
            "Static Memory Fraction",
            RESOURCE_MEMORY,
            "--mem-fraction-static",
            "float",
            "Share of GPU memory for weights and the KV cache pool, 0 to 1.",
            minimum=0.01,
            maximum=1,
        ),
        Parameter(
            "kv_cache_dtype",
            "KV Cache DType",
            RESOURCE_MEMORY,
            "--kv-cache-dtype",
            "choice",
            "Data type of the KV cache.",
            ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"),
        ),
        Parameter(
            "max_total_tokens",
            "Max Total Tokens",
            RESOURCE_MEMORY,
            "--max-total-tokens",
            "int",
            "Tokens the KV cache pool holds (default: from the memory fraction).",
            minimum=1,
        ),
        Parameter(
            "max_running_requests",
            "Max Running Requests",
            SERVING_PERFORMANCE,
            "--max-running-requests",
            "int",
            "Requests one replica runs at once.",
            minimum=1,
        ),
        Parameter(
            "chunked_prefill_size",
            "Chunked Prefill Size",
            SERVING_PERFORMANCE,
            "--chunked-prefill-size",
            "int",
            "Tokens per prefill chunk; -1 turns chunked prefill off.",
            minimum=-1,
        ),
        Parameter(
            "max_prefill_tokens",
            "Max Prefill Tokens",
            SERVING_PERFORMANCE,
            "--max-prefill-tokens",
            "int",
            "Tokens one prefill batch may hold.",
            minimum=1,
        ),
        Parameter(
            "disable_radix_cache",
            "Disable Prefix Caching",
            SERVING_PERFORMANCE,
            "--disable-radix-cache",
            "bool",
            "Turn off the radix (prefix) cache.",
        ),
        Parameter(
            "tool_call_parser",
            "Tool-Call Parser",
            TOOL_REASONING,
            "--tool-call-parser",
            help="How tool calls are read from the output, e.g. qwen25, llama3.",
            placeholder="qwen25",
        ),
        Parameter(
            "reasoning_parser",
            "Reasoning Parser",
            TOOL_REASONING,
            "--reasoning-parser",
            help="How reasoning is split from the answer, e.g. deepseek-r1, qwen3.",
            placeholder="deepseek-r1",
        ),
    ),
)

PARAMETER_TABLES: Mapping[str, ParameterTable] = {
    table.runtime: table for table in (VLLM_PARAMETERS, SGLANG_PARAMETERS)
}


def recorded_flags(table: ParameterTable) -> frozenset[str]:
    """Return the flag names recorded from the pinned version's argument definitions."""
    lines = table.flags_file.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))
