"""OpenAI-compatible HTTP API, Prometheus metrics and the /sim control endpoints."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import math
import secrets
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .config import parse_fault_update
from .engine import VOCABULARY, Admission, Engine, ModelState, embed, generate_words

# One shared encoder: json.dumps with non-default options builds a new encoder per call.
_encode = json.JSONEncoder(separators=(",", ":")).encode

_JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_DONE = b"data: [DONE]\n\n"

# Each word as a JSON string, with and without the space that separates it from the previous one.
_FIRST_WORD_JSON = {word: _encode(word).encode() for word in VOCABULARY}
_NEXT_WORD_JSON = {word: _encode(" " + word).encode() for word in VOCABULARY}

# (type, code, message) for injected failures, worded like OpenAI's own.
_INJECTED_ERRORS: dict[int, tuple[str, str, str]] = {
    429: ("rate_limit_error", "rate_limit_exceeded", "Rate limit reached for {model}."),
    500: ("server_error", "internal_error", "The server had an error processing your request."),
    502: ("server_error", "bad_gateway", "Bad gateway."),
    503: ("server_error", "service_unavailable", "The engine for {model} is overloaded."),
    504: ("server_error", "gateway_timeout", "The engine timed out."),
}

FaultsApplier = Callable[[dict[str, Any]], Awaitable[None]]
FaultsClearer = Callable[[], Awaitable[None]]


class OpenAIError(Exception):
    """A failure answered with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param

    def response(self) -> web.Response:
        """Return the error as an HTTP response."""
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return web.Response(
            status=self.status, body=_encode({"error": error}).encode(), content_type=_JSON
        )


def _missing(param: str) -> OpenAIError:
    return OpenAIError(
        400,
        f"Missing required parameter: '{param}'.",
        code="missing_required_parameter",
        param=param,
    )


def _invalid(param: str, expected: str) -> OpenAIError:
    return OpenAIError(400, f"Invalid '{param}': expected {expected}.", param=param)


@dataclass(slots=True)
class _Prompt:
    tokens: list[str]
    key: str  # what the output is derived from, together with the seed


@dataclass(slots=True)
class _Generation:
    chat: bool
    prompts: list[_Prompt]
    max_tokens: int
    finish_reason: str
    seed: int
    include_usage: bool


def _chat_prompt(messages: object) -> _Prompt:
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "a non-empty array of messages")
    tokens: list[str] = []
    key_parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise _invalid("messages", "an array of message objects")
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise _invalid("messages", "message content to be a string or an array of parts")
        tokens.extend(content.split())
        key_parts.append(f"{message.get('role')}: {content}")
    key = "\n".join(key_parts)
    try:
        key.encode()
    except UnicodeEncodeError:
        # What real engines do with a lone surrogate: the tokenizer fails, the server answers
        # 500, and every engine fails the same request alike.
        raise OpenAIError(
            500, "'utf-8' codec can't encode a surrogate in the prompt.", kind="server_error"
        ) from None
    return _Prompt(tokens, key)


def _outputs(generation: _Generation) -> list[list[str]]:
    """Return each prompt's answer: the same words for the same seed and prompt."""
    return [
        generate_words(generation.seed, prompt.key, generation.max_tokens)
        for prompt in generation.prompts
    ]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(t) for t in value)


def _token_id_prompt(ids: list[int]) -> _Prompt:
    tokens = [str(t) for t in ids]
    return _Prompt(tokens, " ".join(tokens))


def _completion_prompts(prompt: object) -> list[_Prompt]:
    if prompt is None:
        raise _missing("prompt")
    if isinstance(prompt, str):
        return [_Prompt(prompt.split(), prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [_Prompt(p.split(), p) for p in prompt]
        if _is_token_ids(prompt):
            return [_token_id_prompt(prompt)]
        if all(_is_token_ids(p) for p in prompt):
            return [_token_id_prompt(p) for p in prompt]
    raise _invalid("prompt", "a string, an array of strings or an array of token arrays")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class SimulatorApi:
    """The aiohttp application of one simulator process."""

    def __init__(
        self, engine: Engine, apply_faults: FaultsApplier, clear_faults: FaultsClearer
    ) -> None:
        self._engine = engine
        self._apply_faults = apply_faults
        self._clear_faults = clear_faults
        self._model = engine.config.model
        self._model_json = _encode(self._model)
        self._ids = itertools.count(1)
        # A per-process prefix keeps ids unique across simulator restarts without uuid4's cost.
        self._id_prefix = secrets.token_hex(4)
        self._created = int(time.time())
        self._metric_labels = f'{{model_name="{_escape_label(self._model)}"}}'
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/sim/faults", self._get_faults)
        app.router.add_post("/sim/faults", self._post_faults)
        app.router.add_delete("/sim/faults", self._delete_faults)
        app.router.add_get("/sim/stats", self._stats)
        app.router.add_route("*", "/{path:.*}", self._not_found)
        self.app = app

    # -- inference -------------------------------------------------------------------------

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._admit_body(request)
            generation = self._generation(
                body,
                chat=True,
                prompts=[_chat_prompt(body.get("messages"))],
                max_tokens_params=("max_completion_tokens", "max_tokens"),
            )
            return await self._generate(request, generation, stream=self._stream_flag(body))
        except OpenAIError as error:
            return error.response()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._admit_body(request)
            generation = self._generation(
                body,
                chat=False,
                prompts=_completion_prompts(body.get("prompt")),
                max_tokens_params=("max_tokens",),
            )
            return await self._generate(request, generation, stream=self._stream_flag(body))
        except OpenAIError as error:
            return error.response()

    async def _embeddings(self, request: web.Request) -> web.Response:
        try:
            body = await self._admit_body(request)
            texts = body.get("input")
            if isinstance(texts, str):
                texts = [texts]
            elif texts is None:
                raise _missing("input")
            elif not isinstance(texts, list) or not texts:
                raise _invalid("input", "a string or a non-empty array of strings")
            if not all(isinstance(text, str) for text in texts):
                raise _invalid("input", "a string or a non-empty array of strings")
            full_dim = self._engine.config.embedding_dim
            dimensions = body.get("dimensions")
            if dimensions is None:
                dimensions = full_dim
            elif not (_is_int(dimensions) and 1 <= dimensions <= full_dim):
                raise _invalid("dimensions", f"an integer between 1 and {full_dim}")
            encoding = body.get("encoding_format") or "float"
            if encoding not in ("float", "base64"):
                raise _invalid("encoding_format", "'float' or 'base64'")
        except OpenAIError as error:
            return error.response()
        engine = self._engine
        if not engine.loaded.is_set():
            await engine.wait_loaded()
        data = []
        for index, text in enumerate(texts):
            vector = embed(self._model, text, full_dim)
            if dimensions < full_dim:
                # Matryoshka-style shortening: keep the leading components, renormalize.
                vector = vector[:dimensions]
                norm = math.sqrt(math.fsum(v * v for v in vector))
                vector = [v / norm for v in vector]
            embedding: list[float] | str = vector
            if encoding == "base64":
                embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        prompt_tokens = sum(len(text.split()) for text in texts)
        engine.record_embeddings(prompt_tokens)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        result = {"object": "list", "data": data, "model": self._model, "usage": usage}
        return web.Response(body=_encode(result).encode(), content_type=_JSON)

    def _check_api_key(self, request: web.Request) -> None:
        expected = self._engine.config.api_key
        if expected is not None and request.headers.get("Authorization") != f"Bearer {expected}":
            raise OpenAIError(401, "Invalid API key.", code="invalid_api_key")

    async def _admit_body(self, request: web.Request) -> dict[str, Any]:
        """Read the body, apply request faults, then parse JSON and check the model."""
        self._check_api_key(request)
        raw = await request.read()
        engine = self._engine
        engine.requests_total += 1
        if engine.starting_up():
            engine.requests_rejected += 1
            raise OpenAIError(
                503,
                f"The model {self._model} is starting up.",
                kind="server_error",
                code="service_unavailable",
            )
        status = engine.injected_error()
        if status is not None:
            engine.requests_rejected += 1
            raise self._injected_error(status)
        if engine.faults.hang:
            await engine.hang()
        try:
            body = json.loads(raw)
        except ValueError:
            raise OpenAIError(
                400,
                "We could not parse the JSON body of your request. (HINT: This likely means you"
                " aren't using your HTTP library correctly.)",
            ) from None
        if not isinstance(body, dict):
            raise OpenAIError(400, "The request body must be a JSON object.")
        model = body.get("model")
        if model is None:
            raise _missing("model")
        if model != self._model:
            raise OpenAIError(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                code="model_not_found",
                param="model",
            )
        return body

    def _injected_error(self, status: int) -> OpenAIError:
        default_kind = "server_error" if status >= 500 else "invalid_request_error"
        kind, code, message = _INJECTED_ERRORS.get(
            status, (default_kind, None, f"Injected HTTP {status}.")
        )
        return OpenAIError(
            status, message.format(model=self._model) + " (injected fault)", kind=kind, code=code
        )

    def _generation(
        self,
        body: dict[str, Any],
        *,
        chat: bool,
        prompts: list[_Prompt],
        max_tokens_params: Sequence[str],
    ) -> _Generation:
        config = self._engine.config
        max_tokens = config.max_tokens_default
        finish_reason = "stop"  # without a limit the simulated model "decides" to stop
        for param in max_tokens_params:
            value = body.get(param)
            if value is not None:
                if not _is_int(value) or value < 1:
                    raise _invalid(param, "an integer of at least 1")
                max_tokens, finish_reason = value, "length"
                break
        longest = max(len(prompt.tokens) for prompt in prompts)
        if longest + max_tokens > config.max_model_len:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {config.max_model_len} tokens. However,"
                f" you requested {longest + max_tokens} tokens ({longest} in the prompt,"
                f" {max_tokens} in the completion).",
                code="context_length_exceeded",
                param="messages" if chat else "prompt",
            )
        seed = body.get("seed")
        if seed is None:
            seed = config.seed
        elif not _is_int(seed):
            raise _invalid("seed", "an integer")
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return _Generation(chat, prompts, max_tokens, finish_reason, seed, include_usage)

    @staticmethod
    def _stream_flag(body: dict[str, Any]) -> bool:
        stream = body.get("stream")
        if stream is None:
            return False
        if not isinstance(stream, bool):
            raise _invalid("stream", "a boolean")
        return stream

    async def _generate(
        self, request: web.Request, generation: _Generation, *, stream: bool
    ) -> web.StreamResponse:
        engine = self._engine
        if stream:
            response = web.StreamResponse(headers=_SSE_HEADERS)
            try:
                async with engine.admit([p.tokens for p in generation.prompts]) as admission:
                    await self._stream(request, response, generation, admission)
            except ConnectionError:
                pass  # the client went away; the slot is already released
            return response
        async with engine.admit([p.tokens for p in generation.prompts]) as admission:
            if admission.ttft_s > 0:
                await asyncio.sleep(admission.ttft_s)
            rest = (generation.max_tokens - 1) * engine.token_interval()
            if rest > 0:
                await asyncio.sleep(rest)
            admission.completion_tokens = generation.max_tokens * len(generation.prompts)
            admission.outputs = _outputs(generation)
        return self._completion_response(generation, admission.outputs)

    def _completion_response(
        self, generation: _Generation, outputs: Sequence[Sequence[str]]
    ) -> web.Response:
        count = generation.max_tokens
        texts = [" ".join(output) for output in outputs]
        if generation.chat:
            object_name, id_prefix = "chat.completion", "chatcmpl"
            choices: list[dict[str, Any]] = [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": texts[0]},
                    "logprobs": None,
                    "finish_reason": generation.finish_reason,
                }
            ]
        else:
            object_name, id_prefix = "text_completion", "cmpl"
            choices = [
                {
                    "index": index,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": generation.finish_reason,
                }
                for index, text in enumerate(texts)
            ]
        result = {
            "id": self._new_id(id_prefix),
            "object": object_name,
            "created": int(time.time()),
            "model": self._model,
            "choices": choices,
            "usage": self._usage(generation, count * len(texts)),
        }
        return web.Response(body=_encode(result).encode(), content_type=_JSON)

    @staticmethod
    def _usage(generation: _Generation, completion_tokens: int) -> dict[str, int]:
        prompt_tokens = sum(len(prompt.tokens) for prompt in generation.prompts)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}-{self._id_prefix}{next(self._ids):x}"

    async def _stream(
        self,
        request: web.Request,
        response: web.StreamResponse,
        generation: _Generation,
        admission: Admission,
    ) -> None:
        """Send one SSE event per token, paced by TTFT and TPOT, then the finish and [DONE]."""
        engine = self._engine
        await response.prepare(request)
        chat = generation.chat
        object_name = "chat.completion.chunk" if chat else "text_completion"
        response_id = self._new_id("chatcmpl" if chat else "cmpl")
        envelope = (
            f'"id":"{response_id}","object":"{object_name}",'
            f'"created":{int(time.time())},"model":{self._model_json}'
        )
        head = f'data: {{{envelope},"choices":['.encode()
        tail = b'],"usage":null}\n\n' if generation.include_usage else b"]}\n\n"
        token_end = b',"logprobs":null,"finish_reason":null}' + tail
        if chat:
            token_heads = [head + b'{"index":0,"delta":{"content":']
            token_end = b"}" + token_end
        else:
            token_heads = [
                head + b'{"index":%d,"text":' % index for index in range(len(generation.prompts))
            ]
        outputs = _outputs(generation)
        cut_after = engine.faults.cut_stream_after
        stall_after = engine.faults.stall_stream_after
        loop = asyncio.get_running_loop()
        deadline = loop.time() + admission.ttft_s
        # Events due at the same moment go out in one write: far fewer syscalls at tpot 0.
        pending: list[bytes] = []
        for position in range(generation.max_tokens):
            if position == cut_after:
                await self._cut(request, response, pending)
                return
            if position == stall_after:
                if pending:
                    await response.write(b"".join(pending))
                    pending.clear()
                await engine.hang()
            if position:
                deadline += engine.token_interval()
            delay = deadline - loop.time()
            if delay > 0:
                if pending:
                    await response.write(b"".join(pending))
                    pending.clear()
                await asyncio.sleep(delay)
            words = _NEXT_WORD_JSON if position else _FIRST_WORD_JSON
            if chat and not position:
                pending.append(
                    head + b'{"index":0,"delta":{"role":"assistant","content":""' + token_end
                )
            for token_head, output in zip(token_heads, outputs, strict=True):
                pending.append(token_head + words[output[position]] + token_end)
            admission.completion_tokens += len(outputs)
        admission.outputs = outputs
        finish = _encode(generation.finish_reason).encode()
        finish_end = b',"logprobs":null,"finish_reason":' + finish + b"}" + tail
        if chat:
            pending.append(head + b'{"index":0,"delta":{}' + finish_end)
        else:
            pending.extend(token_head + b'""' + finish_end for token_head in token_heads)
        if generation.include_usage:
            usage = self._usage(generation, admission.completion_tokens)
            pending.append(
                f'data: {{{envelope},"choices":[],"usage":{_encode(usage)}}}\n\n'.encode()
            )
        pending.append(_DONE)
        if cut_after == generation.max_tokens:
            # The whole answer, then no end to the chunked body: llama-cpp-python's server
            # closes its streams so.
            await self._cut(request, response, pending)
            return
        await response.write(b"".join(pending))
        await response.write_eof()

    @staticmethod
    async def _cut(
        request: web.Request, response: web.StreamResponse, pending: list[bytes]
    ) -> None:
        """Flush what was generated, then close the connection without finishing the body."""
        if pending:
            await response.write(b"".join(pending))
        transport = request.transport
        if transport is not None:
            # close() (not abort()) so the tokens already written still reach the client.
            transport.close()

    # -- operations ------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._check_api_key(request)
        except OpenAIError as error:
            return error.response()
        if self._engine.starting_up():
            return OpenAIError(
                503,
                f"The model {self._model} is starting up.",
                kind="server_error",
                code="service_unavailable",
            ).response()
        # "state" as runtimes with load/unload report it, so an agent can tell a cold model.
        state = "loaded" if self._engine.state is ModelState.LOADED else "cold"
        entry = {
            "id": self._model,
            "object": "model",
            "created": self._created,
            "owned_by": "nexus-simulator",
            "state": state,
        }
        body = {"object": "list", "data": [entry]}
        return web.Response(body=_encode(body).encode(), content_type=_JSON)

    async def _health(self, request: web.Request) -> web.Response:
        problem = self._engine.health_problem()
        if problem is None:
            return web.Response(body=b'{"status":"ok"}', content_type=_JSON)
        return web.Response(
            status=503, body=_encode({"status": problem}).encode(), content_type=_JSON
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        engine = self._engine
        cache = engine.prefix_cache
        labels = self._metric_labels
        lines = []
        for name, kind, help_text, value in (
            ("num_requests_running", "gauge", "Requests in the running batch.", engine.running),
            ("num_requests_waiting", "gauge", "Requests waiting to run.", engine.waiting),
            (
                "gpu_cache_usage_perc",
                "gauge",
                "KV-cache usage (prefix-cache fill). 1 means 100 percent.",
                cache.usage,
            ),
            (
                "prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in prompt tokens.",
                cache.queried_tokens,
            ),
            (
                "prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in prompt tokens.",
                cache.hit_tokens,
            ),
            (
                "prompt_tokens_total",
                "counter",
                "Prompt tokens processed.",
                engine.prompt_tokens_total,
            ),
            (
                "generation_tokens_total",
                "counter",
                "Generation tokens produced.",
                engine.generation_tokens_total,
            ),
        ):
            lines.append(f"# HELP vllm:{name} {help_text}")
            lines.append(f"# TYPE vllm:{name} {kind}")
            lines.append(f"vllm:{name}{labels} {float(value)!r}")
        lines.append("")
        return web.Response(
            body="\n".join(lines).encode(), headers={"Content-Type": _METRICS_CONTENT_TYPE}
        )

    async def _get_faults(self, request: web.Request) -> web.Response:
        return self._faults_response()

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
            update = parse_fault_update(body)
        except ValueError as error:
            return OpenAIError(400, f"Invalid faults: {error}").response()
        await self._apply_faults(update)
        response = self._faults_response()
        if update.get("refuse_connections"):
            # This connection must not stay usable, or a pooled client would bypass the fault.
            response.force_close()
        return response

    async def _delete_faults(self, request: web.Request) -> web.Response:
        await self._clear_faults()
        return self._faults_response()

    def _faults_response(self) -> web.Response:
        return web.Response(body=_encode(self._engine.fault_state()).encode(), content_type=_JSON)

    async def _stats(self, request: web.Request) -> web.Response:
        return web.Response(body=_encode(self._engine.stats()).encode(), content_type=_JSON)

    async def _not_found(self, request: web.Request) -> web.Response:
        return OpenAIError(404, f"Invalid URL ({request.method} {request.path})").response()
