"""OpenAI request validation and response shapes (no HTTP framework here).

A client's mistake becomes an `ApiError` with an HTTP status and OpenAI's error JSON:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..engine.chat import Message
from ..engine.sampling import SamplingParams


class ApiError(Exception):
    """An error answered as OpenAI-style JSON with `status`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def _number(body: dict, key: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
            integer: bool = False, default: Any = None) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise _bad(f"'{key}' must be {'an integer' if integer else 'a number'}, got {type(v).__name__}", key)
    if isinstance(v, float) and not math.isfinite(v):
        raise _bad(f"'{key}' must be finite", key)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise _bad(f"'{key}' must be {'>' if lo_open else '>='} {lo}, got {v}", key)
    if hi is not None and v > hi:
        raise _bad(f"'{key}' must be <= {hi}, got {v}", key)
    return v


@dataclass
class GenRequest:
    """What both endpoints share once validated."""

    model: str | None
    stream: bool
    params: SamplingParams
    n_predict: int
    stop: list[str] = field(default_factory=list)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    ignore_eos: bool = False             # llama-server's: generate past end-of-generation tokens
    return_tokens: bool = False          # llama-server's: the generated token ids in the response


def parse_common(body: Any) -> GenRequest:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("'model' must be a string", "model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    n = _number(body, "n", integer=True, default=1)
    if n != 1:
        raise _bad("only n=1 is supported", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", body.get("n_predict")))
    key = "max_completion_tokens" if "max_completion_tokens" in body else \
        "max_tokens" if "max_tokens" in body else "n_predict"
    n_predict = -1 if max_tokens is None else _number({key: max_tokens}, key, integer=True)
    if n_predict < -1:
        raise _bad(f"'{key}' must be >= 0, got {n_predict}", key)
    d = SamplingParams()
    params = SamplingParams(
        temperature=_number(body, "temperature", 0, default=d.temperature),
        top_k=_number(body, "top_k", 0, integer=True, default=d.top_k),
        top_p=_number(body, "top_p", 0, 1, lo_open=True, default=d.top_p),
        min_p=_number(body, "min_p", 0, default=d.min_p),
        repeat_penalty=_number(body, "repeat_penalty", 0, lo_open=True, default=d.repeat_penalty),
        repeat_last_n=_number(body, "repeat_last_n", 0, integer=True, default=d.repeat_last_n),
        seed=_number(body, "seed", integer=True, default=None))
    if params.min_p >= 1:
        raise _bad(f"'min_p' must be < 1, got {params.min_p}", "min_p")
    if params.seed is not None and params.seed < 0:  # llama.cpp: -1 (any negative) = random
        params.seed = None
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise _bad("'stop' must be a string or a list of strings", "stop")
    stops = [s for s in stops if s]
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    flags = {}
    for key in ("ignore_eos", "return_tokens"):
        v = body.get(key, False)
        if v is not None and not isinstance(v, bool):
            raise _bad(f"'{key}' must be a boolean", key)
        flags[key] = bool(v)
    return GenRequest(model, stream, params, n_predict, stops,
                      _number(body, "frequency_penalty", -2, 2, default=0.0),
                      _number(body, "presence_penalty", -2, 2, default=0.0), **flags)


ROLES = ("system", "developer", "user", "assistant", "tool")


def parse_messages(body: dict) -> list[Message]:
    msgs = body.get("messages")
    if msgs is None:
        raise _bad("'messages' is required", "messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"{p} must be an object", p)
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _bad(f"{p}.role must be one of {', '.join(ROLES)}", f"{p}.role")
        content = m.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):  # content parts: text only
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise _bad(f"{p}.content[{j}] must be a text part ({{'type': 'text', 'text': ...}})",
                               f"{p}.content")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise _bad(f"{p}.content must be a string or a list of text parts", f"{p}.content")
        out.append(Message("system" if role == "developer" else role, content))
    return out


def parse_prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise _bad("'prompt' is required", "prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(t, str) for t in prompt):
        raise _bad("only one prompt per request is supported", "prompt")
    raise _bad("'prompt' must be a string or a list of token ids", "prompt")


FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def timings(stats, reused: int, n_out: int) -> dict:
    """llama-server's `timings` object."""
    pm, dm = stats.prompt_seconds * 1e3, stats.decode_seconds * 1e3
    return {"cache_n": reused, "prompt_n": stats.prompt_tokens, "prompt_ms": pm,
            "prompt_per_second": stats.prompt_tokens / (pm / 1e3) if pm > 0 else 0.0,
            "predicted_n": n_out, "predicted_ms": dm,
            "predicted_per_second": stats.decode_tokens / (dm / 1e3) if dm > 0 and stats.decode_tokens else 0.0}
