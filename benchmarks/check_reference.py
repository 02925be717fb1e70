"""Each architecture beside the reference engine: perplexity of tiny f32 model files, ours and llama.cpp's.

    python benchmarks/check_reference.py --ref /path/to/llama.cpp/build/bin/llama-perplexity [--ctx 64]

The files are the tests' own (tests/model_factory.py, tests/hf_gemma4.py: written the way llama.cpp's
converter writes them, random weights); the text is the first 6000 bytes of a file given with --text
(default: the GPL-3 text Debian ships). Both engines tokenize the text and score every chunk, so agreement to
~1e-4 checks tokenizer, architecture and file layout together. Ours runs with an f32 KV cache, the
reference with its default f16 one. Exits 1 when any pair differs by more than --tol (relative).
Build the reference as benchmarks/build_reference.sh says (target llama-perplexity).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: the tests' model writers

# Gemma 4 with layers alternating sliding/full: llama.cpp's shared-KV rule reuses layers n-2 / n-1 of the
# non-shared ones, which matches Hugging Face's (and llamacy's) only for such layouts.
ALTERNATING = ["sliding_attention", "full_attention"] * 3


def write_files(d: Path) -> dict[str, Path]:
    from gguf import GGMLQuantizationType as QT

    from tests.hf_gemma4 import MOE, write_gemma4_hf_model, write_llama_cpp_gguf
    from tests.model_factory import write_tiny_model

    files = {a: write_tiny_model(d / f"{a}.gguf", arch=a, wtype=QT.F32, seed=3) for a in
             ("llama", "qwen2", "qwen3", "gemma3", "nemotron")}  # fmt: skip
    dense = write_gemma4_hf_model(d / "g4", seed=2, layer_types=ALTERNATING, num_hidden_layers=6)
    files["gemma4"] = write_llama_cpp_gguf(dense, d / "gemma4.gguf")
    moe = write_gemma4_hf_model(
        d / "g4moe", seed=3, **{**MOE, "layer_types": ALTERNATING, "num_hidden_layers": 6}
    )
    files["gemma4 (MoE)"] = write_llama_cpp_gguf(moe, d / "gemma4moe.gguf")
    # The gated delta-net hybrids, each with the MTP block the converter writes after the last layer.
    from tests import hf_qwen3next as qn

    for kind, name in (("qwen3_next", "qwen3next"), ("qwen3_5", "qwen35"), ("qwen3_5_moe", "qwen35moe")):
        c = qn.hf_config(kind)
        files[name] = qn.write_llama_cpp_gguf(d / f"{name}.gguf", c, qn.random_weights(c, seed=3, mtp=True))
    from tests.hf_nemotron_h import write_llama_cpp_file, write_nemotron_h_hf_model

    nh = write_nemotron_h_hf_model(d / "nh", seed=3)
    files["nemotron_h"] = write_llama_cpp_file(nh, d / "nemotron_h.gguf")
    nh_moe = write_nemotron_h_hf_model(d / "nhmoe", seed=4, moe=True, latent=32)
    files["nemotron_h_moe"] = write_llama_cpp_file(nh_moe, d / "nemotron_h_moe.gguf")
    return files


def ppl(cmd: list[str]) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if m is None:
        tail = (out.stdout + out.stderr).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{' '.join(cmd[:3])}: no perplexity ({tail[0]})")
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the reference engine's llama-perplexity binary")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--only", nargs="*", help="just these architectures (as the table names them)")
    args = ap.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        text = d / "text.txt"
        text.write_bytes(Path(args.text).read_bytes()[:6000])
        print("| architecture | llamacy | reference | relative difference |")
        print("| --- | ---: | ---: | ---: |")
        for name, path in write_files(d).items():
            if args.only and name not in args.only:
                continue
            c = ["-m", str(path), "-f", str(text), "-c", str(args.ctx), "-t", "2"]
            ours = ppl([sys.executable, "-m", "llamacy", "perplexity", *c, "--kv-type", "f32"])
            try:
                theirs = ppl([args.ref, *c, "-b", str(args.ctx)])
            except RuntimeError as e:
                print(f"| {name} | {ours:.4f} | {e} | |")
                failed = True
                continue
            rel = abs(ours - theirs) / theirs
            failed |= rel > args.tol
            print(f"| {name} | {ours:.4f} | {theirs:.4f} | {rel:.1e} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
