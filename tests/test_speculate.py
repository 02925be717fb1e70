"""Speculative decoding: prompt-lookup drafts, the verification rule, and the session that uses them.

The statistical tests run the whole session (drafts, batched verification, KV rollback) over a small-vocabulary
Markov "model" whose exact output distribution can be enumerated, and check that a wrong rule is caught."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from llamacy.errors import UsageError
from llamacy.generation import Session, sampling_params
from llamacy.generation import steps as steps_module
from llamacy.generation.speculate import NgramDrafter, Speculation, speculation, verify_token
from llamacy.sampling import Sampler

# -- prompt lookup ------------------------------------------------------------------------------------------


def test_drafter_proposes_what_followed_the_latest_earlier_ngram():
    d = NgramDrafter(Speculation(ngram=2, draft_max=8))
    d.length = 8
    history = [1, 2, 3, 4, 5, 1, 2, 7, 1, 2]
    # "1 2" occurred at 0 (then 3 4 5) and at 5 (then 7 1 2): the latest earlier one wins.
    assert d.propose(history, 8) == [7, 1, 2]
    assert d.propose(history, 2) == [7, 1]
    assert d.propose([*history, 9], 8) == []  # "2 9" never occurred before
    assert d.propose([5, 6], 8) == []


def test_drafter_length_adapts_to_acceptance():
    d = NgramDrafter(Speculation(draft_max=16))
    assert d.length == 4
    d.feedback(4, 4)
    assert d.length == 8
    d.feedback(8, 8)
    d.feedback(16, 16)
    assert d.length == 16
    d.feedback(16, 2)
    assert d.length == 3
    d.feedback(0, 0)  # nothing drafted: nothing learned
    assert d.length == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (("beam",), "--speculate must be one of"),
        (("ngram", 0), "draft_max (--draft-max) must be an integer in [1, 64]"),
        (("ngram", 4, 0), "ngram (--ngram) must be an integer in [1, 16]"),
        (("ngram", True), "draft_max"),
        (("draft",), "--speculate draft needs --draft-model"),
        (("ngram", 4, 3, "m.gguf"), "--draft-model goes with it"),
        ((None, None, None, "m.gguf"), "--draft-model goes with --speculate draft"),
    ],
)
def test_bad_options_are_one_line_errors(args, message):
    with pytest.raises(UsageError, match=None) as e:
        speculation(*args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_speculation_off():
    assert speculation(None) is None
    assert speculation("none") is None


# -- the verification rule ----------------------------------------------------------------------------------


def _chi2(counts: Counter, probs: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic of observed counts against exact probabilities, and its degrees of freedom.
    Any draw of an outcome with probability 0 makes it infinite."""
    if any(probs.get(k, 0.0) == 0.0 for k in counts):
        return float("inf"), 1
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in probs.items() if p > 0)
    return stat, sum(1 for p in probs.values() if p > 0) - 1


def _bound(df: int) -> float:
    return df + 5 * (2 * df) ** 0.5  # about five standard deviations above the mean of a chi-square(df)


SAMPLED = dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)


def _wrong_rule(sampler, logits, history, draft, q=None):
    """A plausible mistake: accept with probability p(x), but on rejection draw from p itself (x included)."""
    ids, probs = sampler.distribution(logits, history)
    hit = np.flatnonzero(ids == draft)
    if len(hit) and sampler.rng.random() < probs[hit[0]]:
        return draft
    return sampler.sample(logits, history)


@pytest.mark.parametrize("rule, ok", [(verify_token, True), (_wrong_rule, False)])
@pytest.mark.slow
def test_verify_token_keeps_the_distribution(rule, ok):
    logits = np.array([2.0, 1.5, 0.3, -1.0, 0.9], dtype=np.float32)
    sampler = Sampler(sampling_params({**SAMPLED, "seed": 7}), 5)
    ids, p = sampler.distribution(logits)
    exact = {int(i): float(q) for i, q in zip(ids, p, strict=True)}
    n = 20000
    for draft in (0, 2, 4):
        counts = Counter(rule(sampler, logits, [], draft) for _ in range(n))
        stat, df = _chi2(counts, exact, n)
        assert (stat < _bound(df)) == ok, (draft, stat, df)


def test_verify_token_greedy_is_the_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    sampler = Sampler(sampling_params({"temperature": 0}), 4)
    assert [verify_token(sampler, logits, [], d) for d in range(4)] == [1, 1, 1, 1]
    # With a repeat penalty the history decides: token 1, seen, drops below 2.
    pen = Sampler(sampling_params({"temperature": 0, "repeat_penalty": 1.5}), 4)
    assert verify_token(pen, logits, [1], 1) == 2


# -- the whole session over a Markov model --------------------------------------------------------------------


class _KV:
    """memory.Memory's contract, for a model that remembers only its tokens: any rollback is exact."""

    max_rollback = None
    n_seq = 1
    n_ctx = 64

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def length(self, seq: int = 0) -> int:
        return len(self.tokens)

    def append(self, seq: int, ids: list[int]) -> None:
        self.tokens.extend(ids)

    def clear(self, seq: int = 0) -> None:
        self.tokens.clear()

    def truncate(self, seq: int, n: int) -> None:
        del self.tokens[n:]

    def common_prefix(self, seq: int, ids: list[int]) -> int:
        n = 0
        while n < min(len(ids), len(self.tokens)) and self.tokens[n] == ids[n]:
            n += 1
        return n

    def best_cut(self, seq: int, n: int) -> int:
        return n

    def checkpoint(self, seq: int) -> None:
        """Nothing to copy: every length is a tokens list away."""

    def reuse_prefix(self, seq: int, ids: list[int]) -> int:
        keep = 0
        while keep < min(len(ids) - 1, len(self.tokens)) and self.tokens[keep] == ids[keep]:
            keep += 1
        del self.tokens[keep:]
        return keep


class _Cfg:
    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab


class MarkovModel:
    """Logits that depend on the last two tokens of the cache; `evaluated` counts the positions evaluated,
    so a test can see that drafts were verified in batches."""

    def __init__(self, n_vocab: int = 4, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.table = rng.normal(0.0, 1.2, (n_vocab, n_vocab, n_vocab)).astype(np.float32)
        self.cfg = _Cfg(n_vocab)
        self.n_ctx = 64
        self.n_threads = 1
        self.kv = _KV()
        self.batches: list[int] = []

    def logits_after(self, context: list[int]) -> np.ndarray:
        return self.table[context[-2] if len(context) > 1 else 0, context[-1]]

    def eval(self, tokens: list[int], seq: int = 0, logits: str = "last") -> np.ndarray:
        self.batches.append(len(tokens))
        rows = []
        for t in tokens:
            self.kv.tokens.append(t)
            rows.append(self.logits_after(self.kv.tokens))
        return np.stack(rows) if logits == "all" else rows[-1]

    def eval_batch(self, tokens, pos, seq, rows, hidden=False) -> np.ndarray:
        """As Model.eval_batch: the caller records the tokens in the memory afterwards."""
        self.batches.append(len(tokens))
        context, out = list(self.kv.tokens), []
        for t, p in zip(tokens.tolist(), pos.tolist(), strict=True):
            del context[p:]
            context.append(t)
            out.append(self.logits_after(context))
        return np.stack([out[r] for r in rows.tolist()])


class _Decoder:
    def feed(self, tok: int) -> str:
        return "abcdefgh"[tok]

    def flush(self) -> str:
        return ""


class _Tokenizer:
    eot_ids = ()

    def stream_decoder(self) -> _Decoder:
        return _Decoder()


PROMPT = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


def _exact(model: MarkovModel, options: dict, n_tokens: int) -> dict[tuple[int, ...], float]:
    """The probability of every continuation of n_tokens, by enumeration through the sampling chain."""
    sampler = Sampler(sampling_params(options), model.cfg.n_vocab)
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(model.cfg.n_vocab), repeat=n_tokens):
        prob, context = 1.0, list(PROMPT)
        for t in seq:
            ids, p = sampler.distribution(model.logits_after(context), context)
            hit = np.flatnonzero(ids == t)
            prob *= float(p[hit[0]]) if len(hit) else 0.0
            context.append(t)
        out[seq] = prob
    return out


def _draws(model: MarkovModel, options: dict, n_tokens: int, n: int, spec: Speculation | None) -> Counter:
    session = Session(model, _Tokenizer(), n_ctx_train=64)
    counts: Counter = Counter()
    for i in range(n):
        params = sampling_params({**options, "seed": i})
        toks = [t for t, _ in session.generate(PROMPT, params, max_tokens=n_tokens, speculate=spec)]
        counts[tuple(toks)] += 1
    return counts


@pytest.mark.parametrize("rule, ok", [(None, True), (_wrong_rule, False)])
@pytest.mark.slow
def test_session_with_drafts_samples_the_target_distribution(monkeypatch, rule, ok):
    if rule is not None:
        monkeypatch.setattr(steps_module, "verify_token", rule)
    options = {
        **SAMPLED,
        "repeat_penalty": 1.3,
    }  # the penalty makes each position depend on the drafts before it
    model = MarkovModel()
    exact = _exact(model, options, 3)
    n = 6000
    counts = _draws(model, options, 3, n, Speculation(ngram=1, draft_max=4))
    assert max(model.batches[1:]) > 1  # drafts were verified in batches
    stat, df = _chi2(counts, exact, n)
    assert (stat < _bound(df)) == ok, (stat, df)


def _no_residual_rule(sampler, logits, history, draft, q=None):
    """A classic mistake: accept with min(1, p/q), but on rejection draw from p instead of max(0, p - q).
    (The prompt-lookup rule would not do as a wrong rule: it is exact whatever chose the draft.)"""
    ids, probs = sampler.distribution(logits, history)
    p = dict(zip(ids.tolist(), probs.tolist(), strict=True)).get(draft, 0.0)
    qx = dict(zip(q[0].tolist(), q[1].tolist(), strict=True))[draft]
    if sampler.rng.random() * qx < p:
        return draft
    return sampler.sample(logits, history)


@pytest.mark.parametrize("rule, ok", [(None, True), (_no_residual_rule, False)])
@pytest.mark.slow
def test_session_with_a_draft_model_samples_the_target_distribution(monkeypatch, rule, ok):
    if rule is not None:
        monkeypatch.setattr(steps_module, "verify_token", rule)
    options = {**SAMPLED, "repeat_penalty": 1.3}
    model = MarkovModel()
    draft = MarkovModel(seed=5)  # a different model: drafts are often rejected, the residual matters
    exact = _exact(model, options, 3)
    session = Session(model, _Tokenizer(), n_ctx_train=64)
    spec = Speculation("draft", draft_max=3, draft_model="markov")
    counts: Counter = Counter()
    n = 6000
    for i in range(n):
        params = sampling_params({**options, "seed": i})
        gen = session.generate(PROMPT, params, max_tokens=3, speculate=spec, draft_model=draft)
        counts[tuple(t for t, _ in gen)] += 1
    assert max(model.batches[1:]) > 1
    stat, df = _chi2(counts, exact, n)
    assert (stat < _bound(df)) == ok, (stat, df)


def test_session_greedy_with_drafts_equals_plain():
    options = {"temperature": 0, "repeat_penalty": 1.2}
    plain = _draws(MarkovModel(seed=3), options, 12, 1, None)
    model = MarkovModel(seed=3)
    fast = _draws(model, options, 12, 1, Speculation(ngram=1, draft_max=4))
    assert plain == fast
    assert max(model.batches[1:]) > 1
    # The cache holds exactly the prompt and what was generated and evaluated: rejected drafts were cut.
    (out,) = fast
    assert model.kv.tokens == PROMPT + list(out[:-1])


# -- real models: greedy output is byte-identical ---------------------------------------------------------------

CODE = """def load_users(path):
    with open(path) as f:
        data = json.load(f)
    users = []
    for entry in data["users"]:
        name = entry["name"].strip()
        email = entry["email"].lower()
        if not email:
            continue
        users.append({"name": name, "email": email})
    return users
"""

REAL_CASES = [
    # (prompt, options): an edit (long drafts accepted), free text (little to draft), penalties, stop strings
    (f"Fix the bug in this code. Output the corrected code.\n```python\n{CODE}```\n```python\n", {}),
    ("Once upon a time, in a land far away,", {}),
    (f"Repeat this code:\n{CODE}\nAgain:\n", {"repeat_penalty": 1.3, "repeat_last_n": 32}),
    (f"Repeat this code:\n{CODE}\nAgain:\n", {"frequency_penalty": 0.5, "presence_penalty": 0.3}),
    (f"Repeat this code:\n{CODE}\nAgain:\n", {"stop": ["continue"]}),
]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def real_llm(request):
    from llamacy import Llama

    path = request.getfixturevalue("default_model_path" if request.param == "smollm2" else "gemma_model_path")
    return Llama(path, n_ctx=1024, n_threads=2)


@pytest.mark.slow
def test_a_model_drafting_for_itself_is_always_right(default_model_path):
    from llamacy import Llama

    llm = Llama(default_model_path, n_ctx=512, n_threads=2)
    prompt = "Once upon a time, in a land far away,"
    plain = list(llm.generate_tokens(prompt, max_tokens=40, temperature=0))
    drafted = list(
        llm.generate_tokens(
            prompt, max_tokens=40, temperature=0, speculate="draft", draft_model=default_model_path
        )
    )
    assert drafted == plain
    st = llm.last.stats
    assert st.draft_tokens > 20 and st.draft_accepted == st.draft_tokens


@pytest.mark.slow
def test_a_draft_model_with_another_vocabulary_is_refused(gemma_model_path, default_model_path):
    from tests.test_cli import assert_one_line_error, llamacy

    r = llamacy(
        "run",
        "hi",
        "-m",
        str(gemma_model_path),
        "--speculate",
        "draft",
        "--draft-model",
        str(default_model_path),
    )
    assert_one_line_error(r, 2, "different vocabulary")


@pytest.mark.slow
def test_greedy_output_is_identical_with_drafts(real_llm):
    accepted = 0
    for prompt, options in REAL_CASES:
        outs = []
        for spec in (None, "ngram"):
            toks = list(
                real_llm.generate_tokens(prompt, max_tokens=80, temperature=0, speculate=spec, **options)
            )
            outs.append((toks, real_llm.last.text, real_llm.last.finish_reason))
        assert outs[0] == outs[1], (prompt[:40], options)
        accepted += real_llm.last.stats.draft_accepted
    assert accepted > 20  # the edits were drafted and verified, not decoded one by one


# -- the command line ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_and_chat_with_speculate_print_what_plain_decoding_prints(default_model_path):
    from tests.test_cli import llamacy

    prompt = f"Repeat this code:\n{CODE}\nAgain:\n".encode()
    common = ("-m", str(default_model_path), "-n", "48", "--temp", "0", "-t", "2")
    plain = llamacy("run", "-", *common, input=prompt)
    fast = llamacy("run", "-", *common, "--speculate", "ngram", "--draft-max", "6", "-v", input=prompt)
    assert plain.returncode == 0 and fast.returncode == 0, fast.stderr
    assert fast.stdout == plain.stdout
    assert b"drafted" in fast.stderr and b"accepted" in fast.stderr
    chat_plain = llamacy("chat", *common, input=prompt)
    chat_fast = llamacy("chat", *common, "--speculate", "ngram", "--ngram", "2", input=prompt)
    assert chat_fast.returncode == 0, chat_fast.stderr
    assert chat_fast.stdout == chat_plain.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("--speculate", "beam"), "--speculate must be one of"),
        (("--draft-max", "4"), "--draft-max and --ngram go with --speculate ngram"),
        (("--speculate", "ngram", "--ngram", "0"), "--ngram"),
    ],
)
def test_cli_refuses_bad_speculation_before_loading(args, fragment):
    from tests.test_cli import assert_one_line_error, llamacy

    r = llamacy("run", "hi", "-m", "/nonexistent.gguf", *args)
    assert_one_line_error(r, 2, fragment)


@pytest.mark.slow
def test_create_completion_speculates(default_model_path):
    from llamacy import Llama

    llm = Llama(default_model_path, n_ctx=1024, n_threads=2)
    prompt = f"Repeat this code:\n{CODE}\nAgain:\n"
    plain = llm.create_completion(prompt, max_tokens=48, temperature=0)
    fast = llm.create_completion(prompt, max_tokens=48, temperature=0, speculate="ngram", draft_max=8)
    assert fast["choices"][0]["text"] == plain["choices"][0]["text"]
    assert llm.last.stats.draft_accepted > 0
    with pytest.raises(UsageError, match="unknown option"):
        llm.create_completion(prompt, speculation="ngram")
