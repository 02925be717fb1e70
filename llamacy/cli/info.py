"""`llamacy info`: what a model file is and what running it will cost, without loading the weights."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import typer

from llamacy.cli import options as opt
from llamacy.memory import human_size as _size
from llamacy.memory import weights_per_token


def describe(model: str | None, ctx_size: int | None, kv_type: str = "f16") -> dict[str, Any]:
    from llamacy.catalog import resolve_model
    from llamacy.engine import DEFAULT_CTX
    from llamacy.ggml_types import type_name
    from llamacy.gguf import GGUFFile
    from llamacy.model.archs import ARCHITECTURES, config_from_metadata

    path = resolve_model(model)
    f = GGUFFile(path)
    md = f.metadata
    cfg = config_from_metadata(md, path.name)
    n_ctx = ctx_size or min(cfg.n_ctx_train, DEFAULT_CTX)
    weights = sum(t.n_bytes for t in f.tensors.values())
    kv = cfg.kv_bytes(n_ctx, kv_type=kv_type)
    tensors = [(name, t.n_elements, t.n_bytes) for name, t in f.tensors.items()]
    active, read = weights_per_token(tensors, cfg.n_expert, cfg.n_expert_used)
    return {
        "path": str(path),
        "name": cfg.name,
        "architecture": cfg.arch,
        "parameters": int(sum(t.n_elements for t in f.tensors.values())),
        "file_size": f.file_size,  # of a split model, all parts together
        "parts": [p.path for p in f.parts],  # the files read, in order: one, or each part of a split model
        "quant_mix": dict(Counter(type_name(t.type) for t in f.tensors.values()).most_common()),
        "context_length": cfg.n_ctx_train,
        "layers": cfg.n_layer,
        "embedding": cfg.n_embd,
        "heads": cfg.n_head,
        "kv_heads": cfg.n_head_kv,
        "head_dim": cfg.head_dim,
        "feed_forward": cfg.n_ff_exp if cfg.n_expert else cfg.n_ff,
        # Mixture of experts: experts per layer and per token (None for a dense model); the parameters one
        # token computes with.
        "experts": {"total": cfg.n_expert, "used": cfg.n_expert_used} if cfg.n_expert else None,
        "active_parameters": active,
        "vocab_size": cfg.n_vocab,
        "tokenizer": md.get("tokenizer.ggml.model"),
        "tokenizer_pre": md.get("tokenizer.ggml.pre"),
        "chat_template": "tokenizer.chat_template" in md,
        "ctx_size": n_ctx,
        # Layers grouped by recipe, with the positions of a sequence each keeps (sliding-window layers
        # only their window: a ring of window + micro-batch - 1 positions, stored twice).
        "layer_mix": cfg.layer_mix(n_ctx),
        # Multi-token-prediction blocks after the last layer (llama.cpp's converter appends them to Qwen3.5,
        # Qwen3-Next and Nemotron 3 files): loaded past, not run.
        "mtp_blocks": cfg.n_nextn,
        # Whether llamacy drafts with the first of them (speculate mtp, model/mtp.py).
        "mtp_drafts": bool(cfg.n_nextn) and hasattr(ARCHITECTURES[cfg.arch], "mtp_tensors"),
        "kv_type": kv_type,
        # Every expert is mapped (weights counts them all); a token reads read_per_token of them.
        # A recurrent layer's state (delta-net, Mamba2) per sequence, whatever the context's length.
        "memory": {
            "weights": weights,
            "kv_cache": kv,
            "recurrent_state": cfg.state_bytes,
            "total": weights + kv + cfg.state_bytes,
            "read_per_token": read,
        },
    }


def info(
    model_arg: str = typer.Argument(
        None, metavar="[MODEL]", help="A GGUF file or known model name (the same as -m)."
    ),
    model: str = opt.MODEL,
    ctx_size: int = opt.CTX,
    kv_type: str = opt.KV_TYPE,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    # `-m` as every other command takes it; the positional form is kept for the scripts that use it.
    if model_arg is not None and model is not None and model_arg != model:
        from llamacy.errors import UsageError

        raise UsageError(f"two models given: {model_arg!r} and -m {model!r}")
    opt.check_counts(None, ctx_size)
    d = describe(model if model is not None else model_arg, ctx_size, kv_type)
    if as_json:
        typer.echo(json.dumps(d, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    mix = ", ".join(f"{k}×{v}" for k, v in d["quant_mix"].items())
    rows = [
        ("model", f"{d['name']} ({d['path']})"),
        ("architecture", d["architecture"]),
        ("parameters", f"{d['parameters'] / 1e6:.1f} M"),
        ("file size", _file_size(d)),
        ("tensor types", mix),
        (
            "shape",
            f"{d['layers']} layers, {d['embedding']} wide, {d['heads']} heads ({d['kv_heads']} KV) "
            f"of {d['head_dim']}, feed-forward {d['feed_forward']}",
        ),
        *_expert_rows(d),
        ("layers", _layer_mix(d)),
        ("context length", str(d["context_length"])),
        ("vocabulary", f"{d['vocab_size']} tokens, {d['tokenizer']} (pre: {d['tokenizer_pre']})"),
        ("chat template", "yes" if d["chat_template"] else "no (a built-in one is chosen)"),
        (
            "memory",
            f"{_size(d['memory']['total'])} at --ctx-size {d['ctx_size']} "
            f"(weights {_size(d['memory']['weights'])} + {d['kv_type']} KV cache {_size(d['memory']['kv_cache'])}"
            + (
                f" + recurrent state {_size(d['memory']['recurrent_state'])}"
                if d["memory"]["recurrent_state"]
                else ""
            )
            + ")",
        ),
    ]
    if d["experts"]:
        rows.append(("per token", f"reads {_size(d['memory']['read_per_token'])} of the weights"))
    for k, v in rows:
        t.add_row(k, v)
    Console(highlight=False).print(t)


def _file_size(d: dict[str, Any]) -> str:
    n = len(d["parts"])
    return _size(d["file_size"]) + (f", split into {n} parts" if n > 1 else "")


def _expert_rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    if not d["experts"]:
        return []
    e = d["experts"]
    return [
        (
            "experts",
            f"{e['total']} a layer, {e['used']} used per token "
            f"(active parameters {d['active_parameters'] / 1e6:.1f} M of {d['parameters'] / 1e6:.1f} M)",
        )
    ]


def _layer_mix(d: dict[str, Any]) -> str:
    parts = []
    names = {"attention": "attention", "deltanet": "gated delta-net", "mamba2": "Mamba2", "none": "no mixer"}
    for g in d["layer_mix"]:
        what = names.get(g["mixer"], g["mixer"])
        if g["window"]:
            what = f"sliding-window attention ({g['window']})"
        kept = (
            f"keeps a {_size(g['state_bytes'])} state per sequence at any length"
            if g["memory"] == "recurrent"
            else f"keeps {g['positions']} of {d['ctx_size']} positions"
            if g["memory"] not in ("none", "shared")
            else "reads an earlier layer's K/V, keeps nothing"
            if g["memory"] == "shared"
            else "keeps nothing"
        )
        ffn = f" + {g['ffn']} FFN" if g["ffn"] != "none" else ""
        parts.append(f"{g['count']} × {what}{ffn}, {kept}")
    if d["mtp_blocks"]:
        n = d["mtp_blocks"]
        use = "drafts with --speculate mtp" if d.get("mtp_drafts") else "not run"
        parts.append(f"{n} multi-token-prediction block{'s' if n > 1 else ''} in the file, {use}")
    return "; ".join(parts)
