"""A mixture-of-experts model against a dense one with the same active parameters: decode and prefill.

    python3 benchmarks/bench_moe.py                   # 8 experts, 2 used; ~360 MB at q4_k_m; a minute or two
    python3 benchmarks/bench_moe.py --layers 4 --rounds 1  # quicker
    python3 benchmarks/bench_moe.py --stacks --rounds 12   # the MoE file, expert stacks tiled vs stored

Both models are synthetic (random weights: speed does not depend on the values), written with the gguf
package as llama.cpp lays them out (arch llama; the MoE one Mixtral-style, with ffn_gate_inp and the 3-D
ffn_*_exps tensors), their tensor types chosen by llamacy's mixture rules for --type (q4_k_m). The dense model's
feed-forward is n_used experts wide, so a token computes with the same number of parameters in both; the
MoE file is ~n_expert / n_used times larger, far out of the caches, while decode reads only the chosen
experts' rows. Rounds alternate the two models (each in this process, warmed once); medians are printed.
The files carry the default model's tokenizer, so that bench_ab.py can run them beside llama.cpp's
llama-bench (--write-only writes them and stops).

--stacks: the MoE file twice instead, its expert stacks repacked into 8-row tiles as the engine binds them
where the VNNI kernels are on (model/repack.py's experts_repackable) and as stored, both bound once and
alternating in one process (each round a fresh context); the ratio tiled / stored per round, its median and
range.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from llamacy.kernels.quantize import quantize

from llamacy.convert.mixtures import ModelFacts, TensorSpec, choose_types, target
from llamacy.gguf import GGUFFile
from llamacy.model import Model

VOCAB = 49152  # the default model's (SmolLM2's) vocabulary, whose tokenizer the files carry


def add_tokenizer(w: GGUFWriter) -> None:
    """The default model's tokenizer (byte-level BPE), so that `llamacy bench` and llama.cpp's llama-bench
    load the files as they load a real model (bench_ab.py runs both on them)."""
    from llamacy.catalog import resolve_model

    f = GGUFFile(resolve_model(None, allow_pull=False))
    tokens = f.get("tokenizer.ggml.tokens")
    if len(tokens) != VOCAB:
        raise SystemExit(f"the default model's vocabulary is {len(tokens)} tokens, not {VOCAB}")
    w.add_tokenizer_model(f.get("tokenizer.ggml.model"))
    w.add_tokenizer_pre(f.get("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in f.get("tokenizer.ggml.token_type")])
    w.add_token_merges(f.get("tokenizer.ggml.merges"))
    w.add_bos_token_id(f.get("tokenizer.ggml.bos_token_id"))
    w.add_eos_token_id(f.get("tokenizer.ggml.eos_token_id"))


def _shapes(args: argparse.Namespace, moe: bool) -> dict[str, tuple[int, ...]]:
    E, L, NE = args.embd, args.layers, args.experts
    kv = E // 4  # 4 query heads per KV head
    ff = args.ff_exp if moe else args.ff_exp * args.used
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (VOCAB, E)}
    for i in range(L):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (E,), p + "attn_q.weight": (E, E), p + "attn_k.weight": (kv, E),
                       p + "attn_v.weight": (kv, E), p + "attn_output.weight": (E, E), p + "ffn_norm.weight": (E,)})  # fmt: skip
        if moe:
            shapes.update({p + "ffn_gate_inp.weight": (NE, E), p + "ffn_gate_exps.weight": (NE, ff, E),
                           p + "ffn_up_exps.weight": (NE, ff, E), p + "ffn_down_exps.weight": (NE, E, ff)})  # fmt: skip
        else:
            shapes.update({p + "ffn_gate.weight": (ff, E), p + "ffn_up.weight": (ff, E), p + "ffn_down.weight": (E, ff)})  # fmt: skip
    shapes["output_norm.weight"] = (E,)
    shapes["output.weight"] = (VOCAB, E)
    return shapes


def write_model(path: Path, args: argparse.Namespace, moe: bool) -> None:
    E = args.embd
    shapes = _shapes(args, moe)
    specs = [TensorSpec(n, s, 0) for n, s in shapes.items()]  # keep F32 (type 0) for what is not quantized
    facts = ModelFacts("llama", args.layers, E // 64, E // 256, args.experts if moe else 0)
    types = choose_types(specs, target(args.type), facts)
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    w.add_name("synthetic moe" if moe else "synthetic dense")
    w.add_vocab_size(VOCAB)
    w.add_context_length(4096)
    w.add_embedding_length(E)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(args.ff_exp if moe else args.ff_exp * args.used)
    w.add_head_count(E // 64)
    w.add_head_count_kv(E // 256)
    w.add_rope_dimension_count(64)
    w.add_layer_norm_rms_eps(1e-5)
    if moe:
        w.add_expert_count(args.experts)
        w.add_expert_used_count(args.used)
    add_tokenizer(w)
    cache: dict[tuple, np.ndarray] = {}
    for (name, shape), ty in zip(shapes.items(), types, strict=True):
        if len(shape) == 1:
            w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        rows, cols = shape[-2], shape[-1]
        key = (rows, cols, ty)
        if key not in cache:  # one random matrix per shape and type, repeated: values do not affect speed
            x = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
            cache[key] = x if ty == 0 else quantize(ty, x)
        data = cache[key]
        if len(shape) == 3:
            data = np.broadcast_to(data, (shape[0], *data.shape)).copy()
        w.add_tensor(name, data, raw_dtype=None if ty == 0 else ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def measure(path: Path, threads: int, n_prompt: int, n_gen: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of one fresh context."""
    m = Model(GGUFFile(path), n_ctx=n_prompt + n_gen + 1, n_threads=threads)
    return timed(m, np.random.default_rng(1).integers(0, VOCAB, n_prompt + n_gen).tolist(), n_prompt)


def timed(m: Model, ids: list[int], n_prompt: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s): the first n_prompt ids as one prompt, then the rest one by one."""
    n_gen = len(ids) - n_prompt
    t0 = time.perf_counter()
    m.eval(ids[:n_prompt])
    t1 = time.perf_counter()
    for t in ids[n_prompt:]:
        m.eval([t])
    t2 = time.perf_counter()
    return n_prompt / (t1 - t0), n_gen / (t2 - t1)


def stacks(path: Path, threads: int, n_prompt: int, n_gen: int, rounds: int) -> None:
    """The MoE file with its expert stacks tiled and stored, alternating in one process."""
    import llamacy.model.repack as repack

    models = {"tiled": Model(GGUFFile(path), n_ctx=n_prompt + n_gen + 1, n_threads=threads)}
    keep = repack.experts_repackable
    repack.experts_repackable = lambda rows: False
    try:
        models["stored"] = Model(GGUFFile(path), n_ctx=n_prompt + n_gen + 1, n_threads=threads)
    finally:
        repack.experts_repackable = keep
    for kind, m in models.items():
        layouts = sorted(
            {f.layout for layer in m.weights.layers for k, f in layer.items() if k.endswith("_exps")}
        )
        print(f"{kind}: stack layouts {layouts}")
    rng = np.random.default_rng(1)

    def run(m: Model) -> tuple[float, float]:
        m.kv.truncate(0, 0)
        return timed(m, rng.integers(0, VOCAB, n_prompt + n_gen).tolist(), n_prompt)

    for m in models.values():
        run(m)  # warm
    got: dict[str, list[tuple[float, float]]] = {"tiled": [], "stored": []}
    for r in range(rounds):
        for kind in ("tiled", "stored") if r % 2 == 0 else ("stored", "tiled"):
            got[kind].append(run(models[kind]))
    for kind, v in got.items():
        print(
            f"{kind:6s}  prefill {statistics.median(p for p, _ in v):8.1f} tok/s   "
            f"decode {statistics.median(g for _, g in v):6.2f} tok/s"
        )
    for i, what in ((0, "prefill"), (1, "decode")):
        ratios = [a[i] / b[i] for a, b in zip(got["tiled"], got["stored"], strict=True)]
        print(
            f"tiled/stored {what}: {statistics.median(ratios):.3f} (range {min(ratios):.2f}-{max(ratios):.2f}, "
            f"{rounds} rounds)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/llamacy-bench-moe"))
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--ff-exp", type=int, default=2048, help="each expert's feed-forward width")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--used", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=32, help="generated tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--type", default="q4_k_m", help="the mixture (llamacy convert --type)")
    ap.add_argument("--write-only", action="store_true", help="write the two files, print their paths, stop")
    ap.add_argument("--stacks", action="store_true", help="the MoE file's expert stacks tiled vs stored")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind in ("moe", "dense"):
        name = f"{kind}-{args.layers}x{args.embd}-{args.experts}x{args.ff_exp}"
        paths[kind] = args.dir / f"{name}{'' if args.type == 'q4_k_m' else '-' + args.type}.gguf"
        if not paths[kind].exists() or GGUFFile(paths[kind]).get("tokenizer.ggml.model") is None:
            write_model(paths[kind], args, kind == "moe")  # (files from before they carried a tokenizer too)
        print(f"{kind}: {paths[kind].stat().st_size / 2**20:.0f} MiB ({paths[kind]})")
    if args.write_only:
        return
    if args.stacks:
        print(f"{args.threads} threads, pp{args.p} then tg{args.n} a round")
        stacks(paths["moe"], args.threads, args.p, args.n, args.rounds)
        return
    for kind in paths:
        measure(paths[kind], args.threads, 16, 4)  # warm: pages mapped in, thread team up
    results: dict[str, list[tuple[float, float]]] = {"moe": [], "dense": []}
    for r in range(args.rounds):
        for kind in ("moe", "dense") if r % 2 == 0 else ("dense", "moe"):
            results[kind].append(measure(paths[kind], args.threads, args.p, args.n))
    med = {
        k: (statistics.median(p for p, _ in v), statistics.median(g for _, g in v))
        for k, v in results.items()
    }
    for kind, (pp, tg) in med.items():
        print(f"{kind:5s}  prefill {pp:8.1f} tok/s   decode {tg:6.2f} tok/s")
    print(
        f"moe/dense  prefill {med['moe'][0] / med['dense'][0]:.2f}   decode {med['moe'][1] / med['dense'][1]:.2f}"
    )


if __name__ == "__main__":
    main()
