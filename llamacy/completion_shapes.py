"""What Llama.create_completion and Llama.create_chat_completion share: the sampling options picked from
their keyword parameters, the stop list, and OpenAI's response envelope and usage block.

    sampling = sampling_options(locals())             # the eight sampling keywords, as generate_tokens takes
    stops = stop_list(stop)                           # a str, a sequence or None -> a new list
    wrap = envelope("chatcmpl", llm.model_path.name)  # wrap("chat.completion", choice) -> the response dict
    out["usage"] = usage(llm.last.stats)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# The public methods keep these as explicit keyword parameters (llama-cpp-python's signatures); this is the
# one list of which of them go to the sampler.
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


def sampling_options(params: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling keywords of a call's parameters (its locals())."""
    return {key: params[key] for key in SAMPLING_KEYS}


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def envelope(id_prefix: str, model: str) -> Callable[[str, dict], dict]:
    """wrap(object, choice): one response (or chunk) dict; every chunk of a stream shares the id and time."""
    cid = f"{id_prefix}-{uuid.uuid4().hex}"
    created = int(time.time())

    def wrap(obj: str, choice: dict) -> dict:
        return {"id": cid, "object": obj, "created": created, "model": model, "choices": [choice]}

    return wrap


def usage(stats: Any) -> dict[str, int]:
    """OpenAI's usage block from a finished generation's stats."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.gen_tokens,
        "total_tokens": stats.prompt_tokens + stats.gen_tokens,
    }
