"""Llama: load a GGUF model and generate from it. The Python API and what every command builds on."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

import numpy as np

from llamacy.errors import ContextOverflowError, LlamacyError, UnsupportedModelError, UsageError
from llamacy.sampling import Sampler, SamplingParams
from llamacy.stopping import StopMatcher

DEFAULT_CTX = 4096


@dataclass
class Stats:
    load_s: float = 0.0
    prompt_tokens: int = 0  # tokens in the prompt
    prompt_evaluated: int = 0  # of those, evaluated now (the rest came from the KV cache)
    prompt_s: float = 0.0
    gen_tokens: int = 0
    gen_s: float = 0.0
    first_token_s: float = 0.0  # from the call to the first generated token
    profile: dict[str, float] = field(default_factory=dict)  # seconds per stage, with profile=True

    @property
    def prompt_tps(self) -> float:
        return self.prompt_evaluated / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def gen_tps(self) -> float:
        return self.gen_tokens / self.gen_s if self.gen_s > 0 else 0.0


@dataclass
class Completion:
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", or None while running
    stats: Stats = field(default_factory=Stats)


def _sampling_params(sampling: dict[str, Any]) -> SamplingParams:
    aliases = {"temp": "temperature", "repeat_last": "repeat_last_n"}
    kwargs = {aliases.get(k, k): v for k, v in sampling.items() if v is not None}
    try:
        params = SamplingParams(**kwargs)
    except TypeError as e:
        raise UsageError(f"unknown sampling option: {e}") from None
    params.validate()
    return params


class Llama:
    """A loaded model with its tokenizer and one KV cache (conversation state persists across calls)."""

    def __init__(
        self,
        model_path: str | PathLike | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_batch: int = 256,
        verbose: bool = False,
        profile: bool = False,
        kv_type: str = "f16",
    ) -> None:
        t0 = time.perf_counter()
        from llamacy.catalog import resolve_model
        from llamacy.gguf import GGUFFile
        from llamacy.model import Model, default_threads
        from llamacy.model.architectures import config_from_metadata
        from llamacy.model.kv_cache import kv_dtype
        from llamacy.tokenizer import Tokenizer

        kv_dtype(kv_type)  # a bad --kv-type fails before the model loads
        self.kv_type = kv_type

        self.model_path = resolve_model(model_path)
        self.gguf = GGUFFile(self.model_path)
        self.metadata = self.gguf.metadata
        self.config = config_from_metadata(self.metadata, self.model_path.name)
        if n_threads is not None and n_threads < 1:
            raise UsageError(f"--threads must be at least 1, got {n_threads}")
        if n_ctx is not None and n_ctx < 1:
            raise UsageError(f"--ctx-size must be at least 1, got {n_ctx}")
        if n_batch < 1:
            raise UsageError(f"batch size must be at least 1, got {n_batch}")
        self.n_ctx = n_ctx or min(self.config.n_ctx_train, DEFAULT_CTX)
        if self.n_ctx > self.config.n_ctx_train:
            raise UsageError(
                f"--ctx-size {self.n_ctx} exceeds the model's trained context of {self.config.n_ctx_train}"
            )
        self.n_threads = n_threads or default_threads()
        st = self.gguf.file_size
        cache_key = f"{self.model_path.resolve()}:{st}:{self.model_path.stat().st_mtime_ns}"
        self.tokenizer = Tokenizer.from_metadata(self.metadata, cache_key=cache_key)
        if self.tokenizer.n_vocab > self.config.n_vocab:
            raise UnsupportedModelError(
                f"{self.model_path.name}: the tokenizer has {self.tokenizer.n_vocab} tokens "
                f"but the output layer only {self.config.n_vocab}"
            )
        from llamacy.memory import check_fits

        weights = sum(t.n_bytes for t in self.gguf.tensors.values())
        scratch = (
            n_batch * 4 * (6 * self.config.n_embd + 3 * self.config.n_ff) + self.n_threads * self.n_ctx * 4
        )
        check_fits(
            weights,
            self.config.kv_bytes(self.n_ctx, kv_type=kv_type),
            scratch,
            f"{self.model_path.name} at --ctx-size {self.n_ctx}",
        )
        self.model = Model(
            self.gguf, self.n_ctx, self.n_threads, ubatch=n_batch, cfg=self.config, kv_type=kv_type
        )
        self.verbose = verbose
        self.profiling = profile
        if profile:
            self.model.forward.set_profiling(True)
        self.load_s = time.perf_counter() - t0
        self.last: Completion | None = None

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
        self.model.kv.clear()

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """Make the cache hold exactly ids, reusing the common prefix; return the last logits."""
        kv = self.model.kv
        keep = kv.common_prefix(0, ids)
        if keep == len(ids):
            keep -= 1  # the last token is evaluated again: its logits are not stored
        kv.truncate(0, keep)
        return self.model.eval(ids[keep:], logits="last")

    # ---- generation -----------------------------------------------------------------------------------
    def generate_tokens(
        self,
        prompt: str | Sequence[int],
        max_tokens: int | None = 128,
        stop: Sequence[str] = (),
        add_bos: bool | None = None,
        **sampling: Any,
    ) -> Iterator[tuple[int, str]]:
        """Yield (token id, text piece) as generated; the piece is "" while a character or stop string
        is incomplete. self.last holds the Completion (text, finish_reason, stats) as it grows."""
        params = _sampling_params(sampling)
        if max_tokens is not None and max_tokens < 0:
            max_tokens = None  # -1: until the context is full or the model stops
        t0 = time.perf_counter()
        ids = self.tokenize(prompt, add_bos=add_bos) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise UsageError("the prompt is empty (no tokens); give some text")
        if len(ids) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(ids)} tokens but the context holds {self.n_ctx} "
                f"(raise --ctx-size, up to {self.config.n_ctx_train}, or shorten the prompt)"
            )
        done = Completion(stats=Stats(load_s=self.load_s, prompt_tokens=len(ids)))
        self.last = done
        st = done.stats
        prof = self.profiling
        t_sample = t_detok = 0.0
        if prof:
            self.model.forward.profile_reset()
        st.prompt_evaluated = len(ids) - max(0, min(self.model.kv.common_prefix(0, ids), len(ids) - 1))
        logits = self._prefill(ids)
        t1 = time.perf_counter()
        st.prompt_s = t1 - t0
        sampler = Sampler(params, self.n_vocab)
        history = list(ids)
        stops = StopMatcher(list(stop))
        decoder = self.tokenizer.stream_decoder()
        eog = self.tokenizer.eot_ids
        t_gen = t1
        while True:
            if max_tokens is not None and st.gen_tokens >= max_tokens:
                done.finish_reason = "length"
                break
            ts = time.perf_counter()
            if not np.isfinite(logits.max()):  # max() is NaN if any logit is NaN
                raise LlamacyError(
                    f"the model produced non-finite logits at position {len(history)}: "
                    "its weights are likely corrupt"
                )
            tok = sampler.sample(logits, history)
            if prof:
                t_sample += time.perf_counter() - ts
            if st.gen_tokens == 0:
                st.first_token_s = time.perf_counter() - t0
            if tok in eog:
                done.finish_reason = "stop"
                break
            st.gen_tokens += 1
            done.tokens.append(tok)
            history.append(tok)
            ts = time.perf_counter()
            piece = stops.feed(decoder.feed(tok))
            if prof:
                t_detok += time.perf_counter() - ts
            done.text += piece
            yield tok, piece
            if stops.stopped:
                done.finish_reason = "stop"
                break
            if self.model.kv.length(0) >= self.n_ctx or (
                max_tokens is not None and st.gen_tokens >= max_tokens
            ):
                done.finish_reason = "length"
                break
            logits = self.model.eval([tok], logits="last")
            st.gen_s = time.perf_counter() - t_gen
        if not stops.stopped:
            tail = stops.feed(decoder.flush()) + stops.flush()
            if tail:
                done.text += tail
                yield -1, tail
        st.gen_s = time.perf_counter() - t_gen
        if prof:
            st.profile = self.model.forward.profile()
            st.profile["sampling"] = t_sample
            st.profile["detokenizing"] = t_detok
            st.profile["python and other"] = max(0.0, time.perf_counter() - t0 - sum(st.profile.values()))

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
    ) -> dict | Iterator[dict]:
        """An OpenAI-shaped text completion: a dict, or an iterator of chunks when stream=True."""
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        kwargs = dict(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repeat_penalty=repeat_penalty,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            seed=seed,
        )
        cid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = self.model_path.name
        gen = self.generate_tokens(prompt, max_tokens, stop=stops, **kwargs)

        def chunk(text: str, finish: str | None) -> dict:
            return {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
            }

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
        result["usage"] = {
            "prompt_tokens": out.stats.prompt_tokens,
            "completion_tokens": out.stats.gen_tokens,
            "total_tokens": out.stats.prompt_tokens + out.stats.gen_tokens,
        }
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
            "_embedder", Embedder(self.gguf, self.config, self.n_ctx, self.n_threads)
        )
        vectors = embedder.embed(token_lists, normalize=normalize)
        return Embeddings(vectors=vectors.tolist(), input_tokens=[len(ids) for ids in token_lists])
