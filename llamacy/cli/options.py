"""Options shared by several commands, defined once."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import typer

MODEL = typer.Option(
    None, "--model", "-m", help="A GGUF file, a known name (default: smollm2-135m), or OWNER/REPO:QUANT."
)
THREADS = typer.Option(None, "--threads", "-t", help="Threads for the math (default: all available cores).")
CTX = typer.Option(None, "--ctx-size", "-c", help="Context size in tokens (default: min(model's, 4096)).")
KV_TYPE = typer.Option(
    "f16",
    "--kv-type",
    help="KV cache rows: f16 (default), f32 (exact), q8_0 or q4_0 (quantized blocks: about a half and a "
    "quarter of f16's memory; head size a multiple of 32).",
)
SPECULATE = typer.Option(
    None,
    "--speculate",
    help="Speculative decoding: 'ngram' drafts tokens by prompt lookup, 'draft' with --draft-model, "
    "'mtp' with the model's own multi-token-prediction block (Qwen3.5, Qwen3-Next); drafts are verified "
    "in one batched step (same output).",
)
DRAFT_MODEL = typer.Option(
    None, "--draft-model", help="With --speculate draft: a smaller model with the same vocabulary."
)
DRAFT_MAX = typer.Option(
    None, "--draft-max", help="With --speculate: the most tokens drafted per step (16; mtp: 3)."
)
NGRAM = typer.Option(None, "--ngram", help="With --speculate ngram: the n-gram length looked up (3).")


def speculation(
    speculate: str | None, draft_max: int | None, ngram: int | None, draft_model: str | None = None
) -> dict[str, Any]:
    """The speculation keywords of Llama.generate_tokens, validated before any model loads."""
    from llamacy.errors import UsageError
    from llamacy.generation.speculate import speculation as check

    if speculate is None and (draft_max is not None or ngram is not None):
        raise UsageError("--draft-max and --ngram go with --speculate ngram")
    check(speculate, draft_max, ngram, draft_model)
    out = {"speculate": speculate, "draft_max": draft_max, "ngram": ngram}
    return out if draft_model is None else {**out, "draft_model": draft_model}


# The sampling options: (SamplingParams field, type, default, flags, help). Commands take them all through
# @sampling_options, as one dict.
_SAMPLING_TABLE: list[tuple[str, type, Any, tuple[str, ...], str]] = [
    ("temperature", float, 0.8, ("--temp",), "Temperature; 0 = greedy."),
    ("top_k", int, 40, ("--top-k",), "Keep the k most likely tokens; 0 = off."),
    ("top_p", float, 0.95, ("--top-p",), "Nucleus sampling threshold; 1 = off."),
    ("min_p", float, 0.05, ("--min-p",), "Drop tokens below min-p x the top probability; 0 = off."),
    ("repeat_penalty", float, 1.0, ("--repeat-penalty",), "Penalty for repeated tokens; 1 = off."),
    ("repeat_last_n", int, 64, ("--repeat-last-n",), "How many recent tokens the repeat penalty sees."),
    ("presence_penalty", float, 0.0, ("--presence-penalty",), "OpenAI-style presence penalty."),
    ("frequency_penalty", float, 0.0, ("--frequency-penalty",), "OpenAI-style frequency penalty."),
    ("seed", int, None, ("--seed", "-s"), "Random seed, for reproducible sampling; -1 = random."),
]
_SAMPLING = {name: (kind, typer.Option(d, *flags, help=h)) for name, kind, d, flags, h in _SAMPLING_TABLE}

# The default of a command's `sampling` parameter: @sampling_options puts the options in its place.
SAMPLING: Any = object()


def sampling_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command the sampling options (--temp, --top-k, ... --seed) where its `sampling` parameter
    stands; the command receives them as one dict of SamplingParams fields, validated before any model loads
    (--seed -1 becomes None: a random seed)."""

    def collect(sampling: dict[str, Any]) -> dict[str, Any]:
        from llamacy.generation import sampling_params

        if sampling["seed"] == -1:
            sampling["seed"] = None
        sampling_params(sampling)
        return sampling

    return _expand(command, "sampling", SAMPLING, _SAMPLING, collect)


# The default of a command's `spec` parameter: @speculation_options puts the options in its place.
SPECULATION: Any = object()
_SPECULATION = {
    "speculate": (str, SPECULATE),
    "draft_max": (int, DRAFT_MAX),
    "ngram": (int, NGRAM),
    "draft_model": (str, DRAFT_MODEL),
}


def speculation_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command --speculate, --draft-max, --ngram and --draft-model where its `spec` parameter stands;
    the command receives speculation()'s dict (Llama.generate_tokens' keywords), validated before any model
    loads."""
    return _expand(command, "spec", SPECULATION, _SPECULATION, lambda v: speculation(**v))


def _expand(
    command: Callable[..., None],
    name: str,
    marker: Any,
    options: dict[str, tuple[type, Any]],
    collect: Callable[[dict[str, Any]], Any],
) -> Callable[..., None]:
    """The command with its parameter `name` (default `marker`) replaced by the options, for typer; called,
    it passes collect(the options' values) as that parameter."""
    sig = inspect.signature(command, eval_str=True)
    params: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        if p.name != name:
            params.append(p)
            continue
        if p.default is not marker:
            raise TypeError(f"{command.__name__}: the {name} parameter's default must be its options marker")
        params += [
            inspect.Parameter(option_name, p.kind, default=option, annotation=kind)
            for option_name, (kind, option) in options.items()
        ]

    @functools.wraps(command)
    def with_options(**kwargs: Any) -> None:
        values = {option_name: kwargs.pop(option_name) for option_name in options}
        command(**kwargs, **{name: collect(values)})

    with_options.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    with_options.__annotations__ = {p.name: p.annotation for p in params}
    return with_options


def check_counts(threads: int | None, ctx_size: int | None, predict: int | None = None) -> None:
    from llamacy.errors import UsageError, require_range

    if threads is not None:
        require_range("--threads", threads, 1, 1024)
    if ctx_size is not None and not 1 <= ctx_size <= 1 << 24:
        raise UsageError(f"--ctx-size must be between 1 and {1 << 24}, got {ctx_size}")
    if predict is not None and predict < -1:
        raise UsageError(f"--predict must be -1 (no limit) or at least 0, got {predict}")
