"""Options shared by several commands, defined once."""

from __future__ import annotations

from typing import Any

import typer

MODEL = typer.Option(
    None, "--model", "-m", help="A GGUF file, or a known model name (default: smollm2-135m)."
)
THREADS = typer.Option(None, "--threads", "-t", help="Threads for the math (default: all available cores).")
CTX = typer.Option(None, "--ctx-size", "-c", help="Context size in tokens (default: min(model's, 4096)).")
TEMP = typer.Option(0.8, "--temp", help="Temperature; 0 = greedy.")
TOP_K = typer.Option(40, "--top-k", help="Keep the k most likely tokens; 0 = off.")
TOP_P = typer.Option(0.95, "--top-p", help="Nucleus sampling threshold; 1 = off.")
MIN_P = typer.Option(0.05, "--min-p", help="Drop tokens below min-p x the top probability; 0 = off.")
REPEAT_PENALTY = typer.Option(1.0, "--repeat-penalty", help="Penalty for repeated tokens; 1 = off.")
REPEAT_LAST_N = typer.Option(64, "--repeat-last-n", help="How many recent tokens the repeat penalty sees.")
PRESENCE = typer.Option(0.0, "--presence-penalty", help="OpenAI-style presence penalty.")
FREQUENCY = typer.Option(0.0, "--frequency-penalty", help="OpenAI-style frequency penalty.")
KV_TYPE = typer.Option(
    "f16", "--kv-type", help="KV cache values: f16 (half the memory and reads) or f32 (exact)."
)
SEED = typer.Option(None, "--seed", "-s", help="Random seed, for reproducible sampling; -1 = random.")


def sampling_kwargs(
    temp: float,
    top_k: int,
    top_p: float,
    min_p: float,
    repeat_penalty: float,
    repeat_last_n: int,
    presence_penalty: float,
    frequency_penalty: float,
    seed: int | None,
) -> dict[str, Any]:
    """Sampling options as keyword arguments, validated before any model is loaded."""
    from llamacy.generation import sampling_params

    kwargs = dict(
        temperature=temp,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repeat_penalty=repeat_penalty,
        repeat_last_n=repeat_last_n,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        seed=None if seed is not None and seed == -1 else seed,
    )
    sampling_params(kwargs)
    return kwargs


def check_counts(threads: int | None, ctx_size: int | None, predict: int | None = None) -> None:
    from llamacy.errors import UsageError

    if threads is not None and not 1 <= threads <= 1024:
        raise UsageError(f"--threads must be between 1 and 1024, got {threads}")
    if ctx_size is not None and not 1 <= ctx_size <= 1 << 24:
        raise UsageError(f"--ctx-size must be between 1 and {1 << 24}, got {ctx_size}")
    if predict is not None and predict < -1:
        raise UsageError(f"--predict must be -1 (no limit) or at least 0, got {predict}")
