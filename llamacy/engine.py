"""Llama: load a GGUF model and generate from it. The Python API and what every command builds on."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from os import PathLike
from typing import TYPE_CHECKING, Any

import numpy as np

from llamacy.completion_shapes import envelope, sampling_options, stop_list, usage
from llamacy.errors import ContextOverflowError, UnsupportedModelError, UsageError, require_range
from llamacy.generation import Completion, Session, sampling_params
from llamacy.generation.speculate import same_vocabulary, speculation
from llamacy.model.kv_types import DEFAULT_KV_TYPE, kv_format

if TYPE_CHECKING:
    from llamacy.model import Model
    from llamacy.structured import Grammar

DEFAULT_CTX = 4096
# Tokens of a prompt's attention block (ops.pxd's ATT_BLOCK_MAX; a constant here, to size the scratch before
# any kernel module loads).
ATT_BLOCK_TOKENS = 8


def _in_background(fn: Callable[[], Any], name: str = "llamacy-load") -> Callable[[], Any]:
    """Start fn on a thread; the returned function waits for it and returns its result or raises its
    error."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller, whatever it is
            box["error"] = e

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def result() -> Any:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return result


class Llama:
    """A loaded model: its file, config, tokenizer and bound weights. The single-sequence API (generate,
    logits, create_completion) runs in a Session whose Model and KV cache are built on first use, and the
    conversation persists in that cache across calls. A Scheduler builds its own many-sequence Model over
    the same bound weights (new_model), so serving never builds the single-sequence one."""

    def __init__(
        self,
        model_path: str | PathLike | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_batch: int = 256,
        profile: bool = False,
        kv_type: str = DEFAULT_KV_TYPE,
        repack: str | None = None,
    ) -> None:
        """repack: where this CPU reads some matrices faster in another layout (model/repack.py),
        "deferred" binds them as stored and repacks them between the evaluations after the first (the first
        token comes sooner; the decode reaches its speed a few tokens later), "load" repacks them before
        returning (steady speed from the start: benchmarks, servers). None: "load" if LLAMACY_REPACK=load,
        else "deferred". Profiling repacks at load."""
        t0 = time.perf_counter()
        from llamacy.catalog import resolve_model
        from llamacy.gguf import GGUFFile
        from llamacy.kernels import ensure_cpu
        from llamacy.memory import check_fits
        from llamacy.model import default_threads
        from llamacy.model.archs import config_from_metadata
        from llamacy.model.repack import repack_enabled
        from llamacy.model.weights import WeightBinder
        from llamacy.tokenizer import Tokenizer

        ensure_cpu()
        kv_format(kv_type)  # a bad --kv-type fails before the model loads
        if n_threads is not None:
            require_range("--threads", n_threads, 1)
        if n_ctx is not None:
            require_range("--ctx-size", n_ctx, 1)
        require_range("batch size", n_batch, 1)
        if repack is None:
            repack = "load" if os.environ.get("LLAMACY_REPACK") == "load" else "deferred"
        if repack not in ("deferred", "load"):
            raise UsageError(f"repack must be 'deferred' or 'load', not {repack!r}")
        self.kv_type = kv_type
        self.n_batch = n_batch
        self.profiling = profile

        self.model_path = resolve_model(model_path)
        self.gguf = GGUFFile(self.model_path)
        self.metadata = self.gguf.metadata
        self.config = config_from_metadata(self.metadata, self.model_path.name)
        self.n_ctx = n_ctx or min(self.config.n_ctx_train, DEFAULT_CTX)
        if self.n_ctx > self.config.n_ctx_train:
            raise UsageError(
                f"--ctx-size {self.n_ctx} exceeds the model's trained context of {self.config.n_ctx_train}"
            )
        self.n_threads = n_threads or default_threads()
        weights = sum(t.n_bytes for t in self.gguf.tensors.values())
        # Attention's score rows: per thread, one of n_ctx floats per head of a KV group for each token of a
        # prompt's block (model/scratch.pyx); they fill as deep as the prompt reaches.
        scores = self.n_threads * ATT_BLOCK_TOKENS * max(1, self.config.widest()["group"]) * self.n_ctx * 4
        scratch = n_batch * 4 * (6 * self.config.n_embd + 3 * self.config.n_ff) + scores
        check_fits(
            weights,
            self.config.kv_bytes(self.n_ctx, kv_type=kv_type, ubatch=n_batch),
            scratch,
            f"{self.model_path.name} at --ctx-size {self.n_ctx}",
        )
        # Bound now, so that a missing or misshapen tensor fails the load; every Model shares the binding.
        # Where binding repacks (repack.py: every matrix read once, without the GIL), it runs while the
        # tokenizer is built, on the cores that leave one to that: on SmolLM2 each takes about a fifth of
        # the time to the first token. Deferred, the packing stops when the tokenizer is ready (at the end of
        # the matrix in hand) and the Models' evaluations pack the rest.
        background = None  # the packing (and, repacked at load, the binding) on a thread
        stop = threading.Event()  # set when the tokenizer is ready
        helpers = max(1, default_threads() - 1)
        weights = None
        if not repack_enabled():
            weights = WeightBinder(self.gguf, self.config, repack=False).bind()
        elif repack == "deferred" and not profile:
            weights = WeightBinder(self.gguf, self.config, repack=True, threads=self.n_threads).bind(
                defer=True
            )
            pending = weights.deferred
            if pending is not None:
                background = _in_background(lambda: pending.advance(float("inf"), stop=stop, threads=helpers))
        else:
            binder = WeightBinder(self.gguf, self.config, repack=True, threads=helpers)
            background = _in_background(binder.bind)
        try:
            st = self.gguf.file_size
            cache_key = f"{self.model_path.resolve()}:{st}:{self.model_path.stat().st_mtime_ns}"
            self.tokenizer = Tokenizer.from_metadata(self.metadata, cache_key=cache_key)
            if self.tokenizer.n_vocab > self.config.n_vocab:
                raise UnsupportedModelError(
                    f"{self.model_path.name}: the tokenizer has {self.tokenizer.n_vocab} tokens "
                    f"but the output layer only {self.config.n_vocab}"
                )
        except BaseException:
            stop.set()
            if background is not None:
                with contextlib.suppress(BaseException):  # its own error matters less than this one
                    background()
            raise
        stop.set()
        packed = background() if background is not None else None
        self.weights = weights if weights is not None else packed
        self._session: Session | None = None
        self.load_s = time.perf_counter() - t0

    @contextlib.contextmanager
    def idle(self) -> Iterator[threading.Event]:
        """A block in which the model is not evaluated (a chat waiting for its next message): a thread packs
        what the deferred repacking has left (model/repack.py's DeferredRepack), a MoE model's expert
        stacks included, until all is done (the event it yields is then set) or the block ends, at the end
        of the matrix in hand. Evaluations after the block read what was packed (each Model rebinds); the
        results are the same bit for bit either way. Nothing happens where nothing is left to pack."""
        done = threading.Event()
        pending = self.weights.deferred
        if pending is None or not pending.pending:
            done.set()
            yield done
            return
        stop = threading.Event()

        def pack() -> None:
            try:
                pending.advance(float("inf"), wait=True, stop=stop, threads=self.n_threads, idle=True)
            finally:
                done.set()

        result = _in_background(pack, "llamacy-idle-repack")
        try:
            yield done
        finally:
            stop.set()
            # The block ends only once the thread has: an evaluation must not run beside the packing (both use
            # the thread team), so a Ctrl-C that lands here waits for the matrix in hand, then goes on.
            interrupted = False
            while True:
                try:
                    result()
                    break
                except KeyboardInterrupt:
                    interrupted = True
            if interrupted:
                raise KeyboardInterrupt

    def new_model(self, n_ctx: int, n_threads: int, n_seq: int = 1, ubatch: int | None = None) -> Model:
        """A Model over this file's bound weights, with its own scratch and a KV cache for n_seq sequences
        of n_ctx tokens."""
        from llamacy.model import Model

        return Model(
            self.gguf,
            n_ctx,
            n_threads,
            n_seq=n_seq,
            ubatch=ubatch or self.n_batch,
            cfg=self.config,
            kv_type=self.kv_type,
            weights=self.weights,
        )

    @property
    def session(self) -> Session:
        """The single-sequence generation session (its Model is built on first use; that time counts as
        loading)."""
        if self._session is None:
            t0 = time.perf_counter()
            model = self.new_model(self.n_ctx, self.n_threads)
            self._session = Session(model, self.tokenizer, self.config.n_ctx_train, self.profiling)
            self.load_s += time.perf_counter() - t0
        return self._session

    @property
    def model(self) -> Model:
        """The single-sequence Model: evaluation with one KV cache of n_ctx tokens."""
        return self.session.model

    @property
    def last(self) -> Completion | None:
        """The latest generation's Completion (text, tokens, finish_reason, stats), as it grows."""
        return self._session.last if self._session is not None else None

    # ---- tokens ---------------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    def tokenize(self, text: str, add_bos: bool | None = None, special: bool = True) -> list[int]:
        return self.tokenizer.encode(
            text, add_bos=self.tokenizer.add_bos if add_bos is None else add_bos, special=special
        )

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    # ---- evaluation -----------------------------------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits at every position of ids, evaluated from an empty cache: [len(ids), n_vocab]."""
        ids = list(ids)
        if not ids:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(f"{len(ids)} tokens do not fit the context of {self.n_ctx}")
        self.model.kv.clear(0)
        return self.model.eval(ids, logits="all")

    def reset(self) -> None:
        """Forget the conversation held in the KV cache."""
        if self._session is not None:
            self._session.model.kv.clear()

    # ---- memory files (llamacy/model/memory_file.py) ------------------------------------------------------
    def save_memory(self, path: str | PathLike, extra: dict | None = None) -> int:
        """Save the conversation held in the cache (tokens and rows) to a file; return its size. extra: JSON
        to keep with it (load_memory returns it)."""
        from llamacy.model.memory_file import model_identity, save_memory

        return save_memory(path, self.model.kv, 0, model_identity(self.gguf), self.config.arch, extra=extra)

    def load_memory(self, path: str | PathLike) -> Any:
        """Replace the cached conversation with a file's (MemoryFileError, one line and nothing changed, for a
        file of another model, KV type or version, or a truncated or corrupt one); the next generation
        reuses it as far as its prompt starts with the file's tokens. Returns the memory_file.MemoryFile."""
        from llamacy.model.memory_file import load_memory, model_identity

        return load_memory(path, self.model.kv, 0, model_identity(self.gguf), self.config.arch)

    # ---- generation -----------------------------------------------------------------------------------
    def generate_tokens(
        self,
        prompt: str | Sequence[int],
        max_tokens: int | None = 128,
        stop: Sequence[str] = (),
        add_bos: bool | None = None,
        grammar: Grammar | None = None,
        constraint: Any = None,
        speculate: str | None = None,
        draft_max: int | None = None,
        ngram: int | None = None,
        draft_model: str | PathLike | None = None,
        on_prompt: Any = None,
        context_shift: bool = False,
        keep: int = 0,
        **sampling: Any,
    ) -> Iterator[tuple[int, str]]:
        """Yield (token id, text piece) as generated; the piece is "" while a character or stop string
        is incomplete, and a last (-1, text) carries text held back to the end. self.last holds the
        Completion (text, finish_reason, stats) as it grows. `grammar` (from llamacy.structured, e.g.
        json_schema_grammar(schema)) confines the output to it; `constraint` is a per-sequence one already
        made (e.g. StructuredRequest.constraint(), for a lazy tool-call grammar). speculate="ngram" drafts
        up to draft_max tokens per step by prompt lookup (n-grams up to `ngram` long) and verifies them in
        one batched step: greedy output is identical, sampled output keeps its distribution.
        speculate="draft" drafts with draft_model instead (a path or name; a smaller model with the same
        vocabulary, loaded on first use and kept); speculate="mtp" with the model's own
        multi-token-prediction block (Qwen3.5, Qwen3-Next files that carry one). on_prompt(ids): called once the prompt is evaluated (the
        memory then holds exactly it: save_memory saves a prompt cache). context_shift: a prompt longer than
        the context is fitted and a full context drops the older half after the first `keep` tokens
        (llamacy/generation/shift.py) instead of ending the generation."""
        params = sampling_params(sampling)
        spec = speculation(speculate, draft_max, ngram, draft_model)
        drafter_model = self._draft_model(spec.draft_model) if spec is not None and spec.draft_model else None
        if grammar is not None:
            if constraint is not None:
                raise UsageError("give a grammar or a constraint, not both")
            from llamacy.structured import Constraint  # lazily: the structured modules cost start-up

            constraint = Constraint(grammar, self.tokenizer, self.n_vocab)
        if max_tokens is not None and max_tokens < 0:
            max_tokens = None  # -1: until the context is full or the model stops
        ids = self.tokenize(prompt, add_bos=add_bos) if isinstance(prompt, str) else list(prompt)
        session = self.session  # built on first use, which load_s then includes
        yield from session.generate(
            ids,
            params,
            max_tokens,
            stop,
            load_s=self.load_s,
            constraint=constraint,
            speculate=spec,
            draft_model=drafter_model,
            on_prompt=on_prompt,
            shift_keep=keep if context_shift else None,
        )

    def _draft_model(self, name: str) -> Model:
        """The single-sequence Model of a draft model (loaded on first use, kept), checked to share this
        model's vocabulary."""
        drafts = vars(self).setdefault("_drafts", {})
        if name not in drafts:
            draft = Llama(name, n_ctx=self.n_ctx, n_threads=self.n_threads, kv_type=self.kv_type)
            same_vocabulary(self, draft, draft.model_path.name)
            drafts[name] = draft
        return drafts[name].model

    def generate(
        self, prompt: str | Sequence[int], max_tokens: int | None = 128, **kwargs: Any
    ) -> Iterator[str]:
        """Yield text pieces as they are generated (see generate_tokens for the options)."""
        for _, piece in self.generate_tokens(prompt, max_tokens, **kwargs):
            if piece:
                yield piece

    def __call__(self, prompt: str, **kwargs: Any) -> dict | Iterator[dict]:
        return self.create_completion(prompt, **kwargs)

    def create_completion(
        self,
        prompt: str,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stream: bool = False,
        echo: bool = False,
        response_format: dict | None = None,
        grammar: str | None = None,
        json_schema: dict | str | None = None,
        **speculation: Any,
    ) -> dict | Iterator[dict]:
        """An OpenAI-shaped text completion: a dict, or an iterator of chunks when stream=True.
        response_format (OpenAI), grammar (GBNF) or json_schema (llama.cpp's fields) constrain the output.
        speculation: speculate, draft_max, ngram, draft_model, as generate_tokens takes them."""
        unknown = set(speculation) - {"speculate", "draft_max", "ngram", "draft_model"}
        if unknown:
            raise UsageError(f"unknown option(s) for create_completion: {', '.join(sorted(unknown))}")
        from llamacy.openai_shapes import completion_choice
        from llamacy.structured import request_grammar

        stops = stop_list(stop)
        constrained = request_grammar(response_format, grammar, json_schema)
        sampling = sampling_options(locals())
        wrap = envelope("cmpl", self.model_path.name)
        gen = self.generate_tokens(
            prompt, max_tokens, stop=stops, grammar=constrained, **speculation, **sampling
        )

        def chunk(text: str, finish: str | None) -> dict:
            return wrap("text_completion", completion_choice(0, text, finish))

        if stream:

            def chunks() -> Iterator[dict]:
                if echo:
                    yield chunk(prompt, None)
                for _, piece in gen:
                    if piece:
                        yield chunk(piece, None)
                yield chunk("", self.last.finish_reason)

            return chunks()
        for _ in gen:
            pass
        out = self.last
        result = chunk((prompt if echo else "") + out.text, out.finish_reason)
        result["usage"] = usage(out.stats)
        return result

    # ---- embeddings -----------------------------------------------------------------------------------
    def embed(
        self, input: str | list[str] | list[int] | list[list[int]], normalize: bool = True
    ) -> Embeddings:  # noqa: F821 (llamacy.embedding, imported on first call: loading stays lean)
        """Embed text(s) or token id list(s): one vector per input, pooled from the final hidden states.

        A string, a list of strings, a list of token ids (one input) or a list of such lists. Strings are
        tokenized as prompts are (BOS if the model adds one, special tokens parsed). Returns an
        llamacy.embedding.Embeddings: .vectors (list of n_embd floats each, unit length unless
        normalize=False), .input_tokens (tokens per input) and .n_tokens (their sum). The embedder has its
        own scratch and KV cache (made on first use), so the conversation in this Llama's cache is kept.
        """
        from llamacy.embedding import Embedder, Embeddings

        if isinstance(input, str):
            inputs: list = [input]
        elif isinstance(input, (list, tuple)) and input and all(isinstance(t, int) for t in input):
            inputs = [list(input)]
        elif isinstance(input, (list, tuple)):
            inputs = list(input)
        else:
            raise UsageError(f"cannot embed a {type(input).__name__}: give text, texts or token id lists")
        token_lists = []
        for i, x in enumerate(inputs):
            if isinstance(x, str) and x:
                token_lists.append(self.tokenize(x))
            elif isinstance(x, (list, tuple)) and all(isinstance(t, int) for t in x):
                token_lists.append(list(x))  # the embedder refuses an empty one
            else:
                what = "an empty string" if x == "" else f"a {type(x).__name__}"
                raise UsageError(f"input {i} is {what}: give text or a list of token ids")
        # Made once; setdefault is atomic, so threads racing here all end up with the one that was stored.
        embedder = vars(self).get("_embedder") or vars(self).setdefault(
            "_embedder", Embedder(self.gguf, self.config, self.n_ctx, self.n_threads, weights=self.weights)
        )
        vectors = embedder.embed(token_lists, normalize=normalize)
        return Embeddings(vectors=vectors.tolist(), input_tokens=[len(ids) for ids in token_lists])

    def create_chat_completion(self, messages: Sequence[dict], **options: Any) -> dict | Iterator[dict]:
        """An OpenAI-shaped chat completion (a dict, or chunks when stream=True) through the model's chat
        template, with response_format, tools, tool_choice and parallel_tool_calls (see chat_api.py)."""
        from llamacy.chat_api import create_chat_completion

        return create_chat_completion(self, messages, **options)
