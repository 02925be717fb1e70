"""What serving relies on, on hybrid models whose recurrent layers hold one state per sequence instead of
K/V rows (memory.py's recurrent kind): a chat's next turn evaluates only its new tokens, a turn whose history
the template renders differently resumes from the previous prompt's end, speculative decoding keeps greedy
output, the scheduler's batched answers equal solo ones, prompt caches work, and `info` tells the state's
size. Each architecture's own numerics are tested beside its oracle (test_qwen3next.py, test_nemotron_h.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamacy.engine import Llama
from llamacy.sampling import SamplingParams
from llamacy.scheduler import GenerationRequest, Scheduler
from tests.test_cli import llamacy

N_CTX = 256


def _qwen(kind: str, directory: Path) -> Path:
    from tests.hf_qwen3next import hf_config, random_weights, write_llama_cpp_gguf

    c = hf_config(kind, max_position_embeddings=N_CTX)
    return write_llama_cpp_gguf(directory / "model.gguf", c, random_weights(c, seed=5, mtp=True))


def _nemotron_h(directory: Path, **kw) -> Path:
    from llamacy.convert import convert
    from tests.hf_nemotron_h import write_nemotron_h_hf_model

    model = write_nemotron_h_hf_model(directory / "hf", seed=5, **kw)
    convert(model.path, directory / "model.gguf", "f32", threads=1)
    return directory / "model.gguf"


WRITERS = {
    "qwen35": lambda d: _qwen("qwen3_5", d),
    "qwen3next": lambda d: _qwen("qwen3_next", d),
    "nemotron_h": _nemotron_h,
    "nemotron_h_moe": lambda d: _nemotron_h(d, moe=True, latent=32),
}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def path(request, tmp_path_factory) -> Path:
    return WRITERS[request.param](tmp_path_factory.mktemp(request.param))


def _ids(n_vocab: int, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, n_vocab - 8, n)]


def _greedy(llm: Llama, ids: list[int], n: int = 12, **kw) -> list[int]:
    return [t for t, _ in llm.generate_tokens(ids, max_tokens=n, temperature=0, **kw) if t >= 0]


def _engine(path: Path, **kw) -> Llama:
    return Llama(path, n_threads=1, n_ctx=N_CTX, **kw)


def test_the_next_turn_evaluates_only_its_new_tokens(path) -> None:
    llm = _engine(path)
    assert llm.model.memory.recurrent
    n_vocab = llm.config.n_vocab
    first, more = _ids(n_vocab, 30, 1), _ids(n_vocab, 7, 2)
    out = _greedy(llm, first)
    cached = llm.model.kv.length(0)  # the turn, less its last token if the limit (not EOS) ended it
    assert cached == len(first) + len(out) - (llm.last.finish_reason == "length")
    cont = first + out + more
    again = _greedy(llm, cont)
    assert llm.last.stats.prompt_evaluated == len(cont) - cached
    assert _greedy(_engine(path), cont) == again


def test_a_rerendered_turn_resumes_from_the_previous_prompts_end(path) -> None:
    """The history comes back changed inside the reply (a template that drops reasoning, say): the state
    after the reply's first tokens was never kept, the one at the previous prompt's end was."""
    llm = _engine(path)
    n_vocab = llm.config.n_vocab
    first = _ids(n_vocab, 30, 3)
    out = _greedy(llm, first)
    changed = [*first, *out[:3], (out[3] + 1) % n_vocab, *_ids(n_vocab, 5, 4)]
    again = _greedy(llm, changed)
    assert llm.last.stats.prompt_evaluated == len(changed) - len(first)
    assert _greedy(_engine(path), changed) == again


def test_speculative_decoding_keeps_greedy_output(path, tmp_path) -> None:
    """The file's q8_0 twin drafts (a recurrent model too): it mostly agrees with the target, so some
    drafts are accepted and some rejected, and every rejection puts the target's states (and the
    drafter's) back to a snapshot."""
    from llamacy.convert import convert

    twin = tmp_path / "q8.gguf"
    convert(path, twin, "q8_0", threads=1)
    plain, fast = _engine(path), _engine(path)
    prompt = _ids(plain.config.n_vocab, 20, 5)
    want = _greedy(plain, prompt, 40)
    assert _greedy(fast, prompt, 40, speculate="draft", draft_model=twin, draft_max=4) == want
    st = fast.last.stats
    assert st.draft_accepted > 0 and st.draft_tokens > st.draft_accepted
    # Prompt lookup on a looping prompt: drafts from the history, verified the same way.
    looped = prompt[:8] * 4
    assert _greedy(fast, looped, 24, speculate="ngram", draft_max=4) == _greedy(plain, looped, 24)


def test_scheduler_batched_answers_equal_solo_ones(path) -> None:
    llm = _engine(path)
    n_vocab = llm.config.n_vocab
    prompts = [_ids(n_vocab, n, 10 + n) for n in (5, 17, 9, 30)]
    sampling = [
        dict(temperature=0),
        dict(temperature=0.8, seed=3),
        dict(temperature=0),
        dict(temperature=0.9, seed=4),
    ]
    want = [
        [t for t, _ in llm.generate_tokens(p, max_tokens=10, **s) if t >= 0]
        for p, s in zip(prompts, sampling, strict=True)
    ]
    with Scheduler(llm, n_parallel=3, n_ctx=128, prefill_chunk=4) as sched:
        handles = [
            sched.submit(GenerationRequest(p, SamplingParams(**s), max_tokens=10))
            for p, s in zip(prompts, sampling, strict=True)
        ]
        got = [h.result(120).tokens for h in handles]
        # A slot's next turn keeps what its state can go back to, and answers as a fresh engine does.
        cont = prompts[0] + want[0] + [7, 8]
        done = sched.submit(GenerationRequest(cont, SamplingParams(temperature=0), max_tokens=10)).result(120)
    assert got == want
    assert done.tokens == _greedy(_engine(path), cont, 10)


def test_prompt_cache_resumes_a_longer_prompt(path, tmp_path) -> None:
    cache = tmp_path / "prompt.cache"
    common = ("-m", str(path), "-n", "8", "--temp", "0", "-t", "1", "-c", str(N_CTX), "-v")
    first, second = "hello world " * 12, "hello world " * 12 + "and more words"

    def run(prompt: str, *extra: str) -> tuple[bytes, str]:
        r = llamacy("run", prompt, *common, *extra)
        assert r.returncode == 0, r.stderr.decode()
        return r.stdout, r.stderr.decode()

    plain, _ = run(second)
    run(first, "--prompt-cache", str(cache))
    cached, err = run(second, "--prompt-cache", str(cache))
    assert cached == plain
    llm = _engine(path)
    ids1, ids2 = llm.tokenize(first), llm.tokenize(second)
    shared = next((i for i, (a, b) in enumerate(zip(ids1, ids2, strict=False)) if a != b), len(ids1))
    evaluated = int(err.split("prompt ")[1].split(" tok")[0])
    assert evaluated == len(ids2) - shared < len(ids2) // 2


def test_info_shows_the_layer_mix_and_the_state_size(path) -> None:
    r = llamacy("info", "-m", str(path), "--json", "-c", "128")
    assert r.returncode == 0, r.stderr.decode()
    d = json.loads(r.stdout)
    llm = _engine(path)
    mix = {g["mixer"]: g for g in d["layer_mix"]}
    recurrent = "mamba2" if "nemotron" in llm.config.arch else "deltanet"
    assert mix[recurrent]["memory"] == "recurrent" and mix[recurrent]["state_bytes"] > 0
    assert mix["attention"]["positions"] == 128
    assert d["memory"]["recurrent_state"] == llm.config.state_bytes > 0
    assert d["memory"]["total"] == d["memory"]["weights"] + d["memory"]["kv_cache"] + llm.config.state_bytes
    text = " ".join(llamacy("info", "-m", str(path), "-c", "128").stdout.decode().split())  # unwrapped
    assert ("Mamba2" if recurrent == "mamba2" else "gated delta-net") in text
    assert "state per sequence at any length" in text
