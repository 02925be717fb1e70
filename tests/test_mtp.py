"""Speculative decoding with the model's own multi-token-prediction block (model/mtp.py, speculate mtp).

The oracle is tests/hf_qwen3next.py's float64 MTP pass (hf_mtp_logits: vLLM's Qwen3.5 / Qwen3-Next MTP
module over the model's final hidden states), on the tiny random checkpoints of test_qwen3next.py written
as llama.cpp's converter writes them (the block after the last layer). Random weights give a block that
agrees with the model by chance only, so speed is not tested here (BENCHMARKS.md); what is: the block's
logits, the drafts it makes from them, the bookkeeping of its entries across steps, rejections and turns,
and greedy output identical to decoding without drafts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamacy.engine import Llama
from llamacy.errors import UsageError
from llamacy.gguf import GGUFFile
from llamacy.model import Model
from llamacy.model.mtp import MtpHead
from llamacy.sampling import SamplingParams
from llamacy.scheduler import GenerationRequest, Scheduler
from tests.hf_qwen3next import hf_config, hf_hidden, hf_mtp_logits, random_weights, write_llama_cpp_gguf
from tests.test_qwen3next import _rel

KINDS = ("qwen3_5", "qwen3_next", "qwen3_5_moe")
F32_BOUND = 1e-4  # relative to the largest value: float32 arithmetic against float64
N_CTX = 128
IDS = np.random.default_rng(11).integers(3, 300, 14).tolist()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, tuple[dict, dict, Path]]:
    """Per kind: (config, checkpoint tensors, llama.cpp-style F32 GGUF with its MTP block), a context of
    N_CTX (test_qwen3next.py's files have the default)."""
    out = {}
    for kind in KINDS:
        c = hf_config(kind, max_position_embeddings=N_CTX)
        w = random_weights(c, seed=5, mtp=True)
        out[kind] = (c, w, write_llama_cpp_gguf(tmp_path_factory.mktemp(kind) / "model.gguf", c, w))
    return out


def _model(path: Path, threads: int = 1, n_seq: int = 1) -> Model:
    return Model(GGUFFile(path), n_ctx=N_CTX, n_threads=threads, n_seq=n_seq, kv_type="f32")


def _hidden(m: Model, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Logits and final hidden states of every position of ids, in sequence 0 from position 0."""
    n = len(ids)
    rows = np.arange(n, dtype=np.int32)
    logits, hidden = m.eval_batch(
        np.asarray(ids, np.int32), rows, np.zeros(n, np.int32), rows, hidden_rows=rows
    )
    m.kv.append(0, ids)
    return logits, hidden


@pytest.mark.parametrize("kind", KINDS)
def test_hidden_rows_come_with_the_logits(files, kind: str) -> None:
    """The hidden states a step hands the drafter are the model's final hidden states (the oracle's), and
    asking for them leaves the logits as they were, bit for bit."""
    c, w, path = files[kind]
    m = _model(path)
    logits, hidden = _hidden(m, IDS)
    assert _rel(hidden, hf_hidden(c, w, IDS)) <= F32_BOUND
    m.kv.clear(0)
    assert np.array_equal(m.eval(IDS, logits="all"), logits)
    m.kv.clear(0)
    assert np.array_equal(m.eval(IDS, logits="all", hidden=True), hidden)


@pytest.mark.parametrize("kind", KINDS)
def test_the_block_matches_the_oracle(files, kind: str) -> None:
    """Fed one position at a time, as decoding feeds it, the block's logits at each entry match the
    float64 MTP pass; fed the whole prompt at once, its last output is the same bits."""
    c, w, path = files[kind]
    m = _model(path)
    _, hidden = _hidden(m, IDS)
    head = MtpHead(m)
    got = []
    for j in range(len(IDS) - 1):
        h = head.observe(0, IDS[: j + 1], IDS[j + 1], j, hidden[j : j + 1])
        got.append(head.head(h))
    assert head.src[0] == list(range(len(IDS) - 1))
    ref = hf_mtp_logits(c, w, IDS)
    assert _rel(np.stack(got), ref) <= F32_BOUND
    # Not degenerate: the block's predictions move with the input.
    assert len({int(np.argmax(r)) for r in ref}) > 3
    fresh = MtpHead(m)
    h_all = fresh.observe(0, IDS[:-1], IDS[-1], 0, hidden[:-1])
    assert np.array_equal(fresh.head(h_all), got[-1])


def test_a_changed_turn_keeps_the_entries_that_still_hold(files) -> None:
    """A new turn that shares a prefix: the entries before it stay, the one that read a changed token is
    dropped, and the position whose hidden state the turn did not recompute is left out (by design)."""
    _, _, path = files["qwen3_5"]
    m = _model(path)
    _, hidden = _hidden(m, IDS)
    head = MtpHead(m)
    head.observe(0, IDS[:-1], IDS[-1], 0, hidden[:-1])
    changed = [*IDS[:8], (IDS[8] + 1) % 300, *IDS[9:]]
    m.kv.truncate(0, 8)
    n = len(changed)
    rows = np.arange(8, n, dtype=np.int32)
    _, tail = m.eval_batch(
        np.asarray(changed[8:], np.int32), rows, np.zeros(n - 8, np.int32), rows - 8, hidden_rows=rows - 8
    )
    m.kv.append(0, changed[8:])
    head.observe(0, changed[:-1], changed[-1], 8, tail[:-1])
    # Entry 7 read IDS[8], which changed: dropped, and position 7's hidden state is not recomputed.
    assert head.src[0] == [*range(7), *range(8, n - 1)]


@pytest.mark.parametrize("kind", KINDS)
def test_drafts_are_the_blocks_predictions(files, kind: str, monkeypatch) -> None:
    """Each greedy draft's first token is the oracle block's argmax after the history it was made for."""
    from llamacy.generation import speculate

    c, w, path = files[kind]
    seen: list[tuple[list[int], list[int]]] = []
    real = speculate.MtpDrafter.propose

    def spy(self, history, limit):
        draft = real(self, history, limit)
        seen.append((list(history), draft))
        return draft

    monkeypatch.setattr(speculate.MtpDrafter, "propose", spy)
    llm = Llama(path, n_threads=1, n_ctx=N_CTX)
    out = [t for t, _ in llm.generate_tokens(IDS, max_tokens=16, temperature=0, speculate="mtp") if t >= 0]
    drafted = [(history, draft) for history, draft in seen if draft]  # (a pause drafts nothing)
    assert len(out) == 16 and len(drafted) >= 3
    for history, draft in drafted[:3]:
        ref = hf_mtp_logits(c, w, history)[-1]
        top = np.sort(ref)[-2:]
        assert draft and draft[0] == int(np.argmax(ref)), (history, draft)
        assert top[1] - top[0] > 1e-3 * np.abs(ref).max()  # no near-tie the float32 engine could flip


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_output_is_unchanged(files, kind: str) -> None:
    """With drafts from the block (rejected here: random weights), greedy output equals plain decoding's,
    at one and two threads, and a chat's next turn evaluates only its new tokens."""
    _, _, path = files[kind]
    plain = Llama(path, n_threads=1, n_ctx=N_CTX)
    want = [t for t, _ in plain.generate_tokens(IDS, max_tokens=24, temperature=0) if t >= 0]
    for threads in (1, 2):
        llm = Llama(path, n_threads=threads, n_ctx=N_CTX)
        got = [
            t for t, _ in llm.generate_tokens(IDS, max_tokens=24, temperature=0, speculate="mtp") if t >= 0
        ]
        assert got == want
        assert llm.last.stats.draft_tokens > 0
        cached = llm.model.kv.length(0)
        cont = IDS + want + [5, 6, 7]
        again = [
            t for t, _ in llm.generate_tokens(cont, max_tokens=8, temperature=0, speculate="mtp") if t >= 0
        ]
        assert llm.last.stats.prompt_evaluated == len(cont) - cached
        assert again == [t for t, _ in plain.generate_tokens(cont, max_tokens=8, temperature=0) if t >= 0]


def test_a_block_that_is_wrong_pauses_and_one_that_is_right_does_not(files, monkeypatch) -> None:
    """The random block is never right: after a few drafts it drafts only now and then (pauses of 1, 2, 4,
    ... steps), costing little; drafts that are always right (the known continuation standing in) never
    pause. Both decisions follow from acceptance alone: two runs draft the same."""
    from llamacy.generation import speculate

    _, _, path = files["qwen3_5"]
    plain = Llama(path, n_threads=1, n_ctx=N_CTX)
    want = [t for t, _ in plain.generate_tokens(IDS, max_tokens=64, temperature=0) if t >= 0]
    paused: list[int] = []
    feedback = speculate.MtpDrafter.feedback

    def record(self, drafted, accepted):
        feedback(self, drafted, accepted)
        paused.append(self.paused_steps)

    monkeypatch.setattr(speculate.MtpDrafter, "feedback", record)
    runs = []
    for _ in range(2):
        llm = Llama(path, n_threads=1, n_ctx=N_CTX)
        got = [
            t for t, _ in llm.generate_tokens(IDS, max_tokens=64, temperature=0, speculate="mtp") if t >= 0
        ]
        assert got == want
        runs.append((llm.last.stats.draft_tokens, llm.last.stats.draft_accepted, paused[-1]))
    assert runs[0] == runs[1]
    drafted, accepted, sat_out = runs[0]
    assert accepted == 0 and 0 < drafted <= 14 and sat_out >= 40
    real = speculate.MtpDrafter.propose

    def right(self, history, limit):
        guess = real(self, history, limit)
        done = len(history) - len(IDS)
        return want[done : done + len(guess)]

    monkeypatch.setattr(speculate.MtpDrafter, "propose", right)
    llm = Llama(path, n_threads=1, n_ctx=N_CTX)
    got = [t for t, _ in llm.generate_tokens(IDS, max_tokens=64, temperature=0, speculate="mtp") if t >= 0]
    assert got == want and paused[-1] == 0 and llm.last.stats.draft_accepted > 20


def test_accepted_drafts_keep_the_block_in_step(files, monkeypatch) -> None:
    """Drafts that are accepted (the continuation known in advance stands in for the block's guesses):
    the output is unchanged, and afterwards the block holds one entry per kept position, with the K/V
    rows of a block fed the whole history at once, bit for bit."""
    from llamacy.generation import speculate

    _, _, path = files["qwen3_5"]
    plain = Llama(path, n_threads=1, n_ctx=N_CTX)
    want = [t for t, _ in plain.generate_tokens(IDS, max_tokens=20, temperature=0) if t >= 0]
    real = speculate.MtpDrafter.propose

    def oracle(self, history, limit):
        guess = real(self, history, limit)  # the block runs (and chains) as ever
        done = len(history) - len(IDS)
        return want[done : done + len(guess) + 1][:limit]

    monkeypatch.setattr(speculate.MtpDrafter, "propose", oracle)
    llm = Llama(path, n_threads=1, n_ctx=N_CTX, kv_type="f32")
    got = [t for t, _ in llm.generate_tokens(IDS, max_tokens=20, temperature=0, speculate="mtp") if t >= 0]
    assert got == want
    st = llm.last.stats
    assert st.draft_accepted > 5 and st.draft_accepted == st.draft_tokens
    head = llm.session.batcher.mtp_head()
    kept = llm.model.kv.length(0)
    assert head.src[0] == list(range(kept - 1))
    m = _model(path)
    history = IDS + want
    _, hidden = _hidden(m, history[:kept])
    fresh = MtpHead(m)
    fresh.observe(0, history[: kept - 1], history[kept - 1], 0, hidden[: kept - 1])
    for ours, theirs in ((head.memory.layers[0].k, fresh.memory.layers[0].k),
                         (head.memory.layers[0].v, fresh.memory.layers[0].v)):  # fmt: skip
        assert np.array_equal(ours[0, :, : kept - 1], theirs[0, :, : kept - 1])


def test_batched_sequences_draft_and_answer_as_alone(files) -> None:
    """Several sequences in one scheduler, each with the block: answers equal solo decoding's."""
    _, _, path = files["qwen3_next"]
    llm = Llama(path, n_threads=1, n_ctx=N_CTX)
    prompts = [IDS, IDS[:5], IDS[3:]]
    want = [[t for t, _ in llm.generate_tokens(p, max_tokens=10, temperature=0) if t >= 0] for p in prompts]
    with Scheduler(llm, n_parallel=2, n_ctx=N_CTX, prefill_chunk=4) as sched:
        handles = [
            sched.submit(GenerationRequest(p, SamplingParams(temperature=0), max_tokens=10, speculate=_mtp()))
            for p in prompts
        ]
        got = [h.result(120).tokens for h in handles]
    assert got == want


def _mtp():
    from llamacy.generation.speculate import speculation

    return speculation("mtp")


def test_sampled_output_is_reproducible(files) -> None:
    _, _, path = files["qwen3_5_moe"]
    runs = []
    for _ in range(2):
        llm = Llama(path, n_threads=1, n_ctx=N_CTX)
        gen = llm.generate_tokens(IDS, max_tokens=16, temperature=0.9, seed=4, speculate="mtp")
        runs.append([t for t, _ in gen if t >= 0])
    assert runs[0] == runs[1] and len(runs[0]) == 16


def test_run_and_batch_draft_with_the_block(files, tmp_path) -> None:
    """`run --speculate mtp` prints what plain `run` prints; `batch --speculate mtp` answers as plain."""
    import json

    from tests.test_cli import llamacy

    _, _, path = files["qwen3_next"]
    common = ("-m", str(path), "-n", "10", "--temp", "0", "-t", "1", "-c", str(N_CTX))
    plain = llamacy("run", *common, "hello world")
    fast = llamacy("run", *common, "--speculate", "mtp", "hello world")
    assert plain.returncode == fast.returncode == 0
    assert fast.stdout == plain.stdout and plain.stdout
    items = tmp_path / "items.jsonl"
    items.write_text(
        "".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(["a b", "c d e"]))
    )
    outs = []
    for extra in ((), ("--speculate", "mtp")):
        out = tmp_path / f"out{len(outs)}.jsonl"
        r = llamacy("batch", *common, str(items), "-o", str(out), *extra)
        assert r.returncode == 0, r.stderr
        outs.append(sorted(json.loads(line)["completion"] for line in out.read_text().splitlines()))
    assert outs[0] == outs[1]


def test_a_model_without_a_block_is_refused_in_one_line(tmp_path) -> None:
    from tests.test_cli import llamacy

    c = hf_config("qwen3_5", max_position_embeddings=N_CTX)
    path = write_llama_cpp_gguf(tmp_path / "plain.gguf", c, random_weights(c, seed=5))
    with pytest.raises(UsageError, match="no multi-token-prediction block"):
        MtpHead(_model(path))
    r = llamacy("run", "-m", str(path), "-n", "4", "--speculate", "mtp", "hello")
    assert r.returncode != 0
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "multi-token-prediction" in lines[0], r.stderr


def test_openai_requests_draft_with_the_block(files) -> None:
    """speculate: "mtp" per request with the real OpenAI client: the text of plain decoding, alone and
    under concurrent load; a model without the block answers 400 in one line."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from tests.test_server import running_server, solo_text

    _, _, path = files["qwen3_5"]
    llm = Llama(path, n_threads=1, n_ctx=N_CTX)
    prompts = ["hello world", "the cat sat on", "1 2 3 4", "a b a b a"]
    want = [solo_text(llm, p, 12, temperature=0) for p in prompts]
    with running_server(llm) as (srv, sched):
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)

        def ask(prompt: str) -> str:
            r = client.completions.create(
                model="tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body={"speculate": "mtp"}
            )
            return r.choices[0].text

        assert ask(prompts[0]) == want[0]
        assert sched.draft_tokens_total > 0  # alone in its steps, it drafted
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(ask, prompts)) == want
    c = hf_config("qwen3_5", max_position_embeddings=N_CTX)
    plain = Llama(write_llama_cpp_gguf(path.parent / "plain.gguf", c, random_weights(c, seed=5)), n_ctx=N_CTX)
    with running_server(plain) as (srv, _):
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="no multi-token-prediction block"):
            client.completions.create(
                model="tiny", prompt="Hi", max_tokens=2, extra_body={"speculate": "mtp"}
            )
