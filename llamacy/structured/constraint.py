"""One sequence's grammar state: which tokens may come next, which are forced, and whether it is finished.

    c = Constraint(grammar, llm.tokenizer, n_logits=llm.n_vocab)
    c.forced()                 # tokens the grammar leaves no choice about: evaluate them as one batch
    c.fits(tok)                # one token checked (~15 us)
    c.allowed()                # the whole mask, bool [n_logits], for Sampler.sample(mask=)
    c.accept(tok); c.done      # advance; the grammar is complete
    (decode.next_tokens puts these together; TriggeredConstraint is the lazy variant for tool_choice "auto")

Each sequence owns its Constraint, so constrained and unconstrained sequences can share a batch: the mask only
touches that sequence's logits. When the grammar is complete (`done`), generation ends with finish_reason
"stop" without sampling an end token; while it is only `accepting` (e.g. after a number that could go on),
the end-of-generation tokens are in the mask and the model chooses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llamacy.errors import LlamacyError, UsageError
from llamacy.structured.grammar import Grammar, one_line
from llamacy.structured.vocab import ll_tokenizer


class Constraint:
    """An llguidance matcher for one sequence, with its mask in the shape the sampler takes."""

    def __init__(self, grammar: Grammar, tokenizer: Any, n_logits: int | None = None) -> None:
        import llguidance  # here, not at the top: plain generation never pays for its import (~25 ms)

        self.grammar = grammar
        self.n_vocab = tokenizer.n_vocab
        # The output layer can be wider than the vocabulary (padding rows): those ids are never allowed.
        self.n_logits = max(int(n_logits or self.n_vocab), self.n_vocab)
        self._matcher = llguidance.LLMatcher(ll_tokenizer(tokenizer), grammar.text, log_level=0)
        if self._matcher.is_error():
            raise UsageError(f"invalid {grammar.what}: {one_line(self._matcher.get_error())}")
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self._allowed = np.zeros(self.n_logits, dtype=bool)
        # A grammar that admits no output at all (`x ::= x`, a schema that is only "$ref": "#") is bad input,
        # found now rather than as a failure at the first token.
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self._matcher.is_error() or not self._bits.any():
            raise UsageError(
                f"invalid {grammar.what}: nothing can be generated from it (a rule defined only by itself?)"
            )

    # ---- state --------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (the matcher has stopped)."""
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """What was generated so far is a complete sentence of the grammar."""
        return self._matcher.is_accepting()

    # ---- next token ---------------------------------------------------------------------------------
    def allowed(self) -> np.ndarray:
        """Bool [n_logits]: True where the token may come next. The array is reused by the next call."""
        m = self._matcher
        m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self._raise_if_error()
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self.n_vocab)
        self._allowed[: self.n_vocab] = bits.view(bool)
        if not self._allowed.any():
            raise LlamacyError(f"the {self.grammar.what} allows no next token (it cannot finish)")
        return self._allowed

    def forced(self) -> list[int]:
        """Tokens that must come next whatever the model prefers (possibly none)."""
        return self._matcher.compute_ff_tokens()

    def accept(self, token: int) -> None:
        """Advance past `token` (sampled under this constraint's mask, or forced)."""
        if not self._matcher.consume_token(int(token)):
            self._raise_if_error()
            raise LlamacyError(f"token {token} does not fit the {self.grammar.what}")

    def accept_all(self, tokens: list[int]) -> None:
        if tokens and not self._matcher.consume_tokens([int(t) for t in tokens]):
            self._raise_if_error()
            raise LlamacyError(f"tokens {tokens} do not fit the {self.grammar.what}")

    def fits(self, token: int) -> bool:
        """Whether `token` may come next (one token checked, far cheaper than a whole mask)."""
        return 0 <= token < self.n_vocab and self._matcher.validate_tokens([int(token)]) == 1

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` the grammar accepts from here, in order, without consuming any."""
        return self._matcher.validate_tokens([int(t) for t in tokens])

    def reset(self) -> None:
        """Back to the start of the grammar (a fresh generation with the same request)."""
        self._matcher.reset()

    def _raise_if_error(self) -> None:
        if self._matcher.is_error():
            raise LlamacyError(
                f"{self.grammar.what} constraint failed: {one_line(self._matcher.get_error())}"
            )


class TriggeredConstraint:
    """Free text until the output spells `trigger`, then `grammar` from the byte after it (llama.cpp's lazy
    grammars). With tool_choice "auto" the model may answer in prose, and once it opens a <tool_call> the
    call it writes is valid against the tools' schemas.

    The trigger can end inside a token (">\\n{" is one token in some vocabularies): the bytes after it are
    tokenized again and fed to the grammar. If the grammar refuses them, the output stays free text (and the
    reply is parsed as such)."""

    def __init__(self, trigger: str, grammar: Grammar, tokenizer: Any, n_logits: int | None = None) -> None:
        self.trigger = trigger.encode("utf-8")
        self.grammar = grammar
        self.n_vocab = tokenizer.n_vocab
        self.n_logits = max(int(n_logits or self.n_vocab), self.n_vocab)
        self._tokenizer = tokenizer
        ll_tokenizer(tokenizer)  # built now, not at the trigger
        self._tail = b""  # the output's last bytes, where the trigger may be starting
        self._inner: Constraint | None = None
        self._abandoned = False
        self._free: np.ndarray | None = None

    @property
    def triggered(self) -> bool:
        return self._inner is not None

    @property
    def done(self) -> bool:
        return self._inner is not None and self._inner.done

    @property
    def accepting(self) -> bool:
        return self._inner is None or self._inner.accepting

    def allowed(self) -> np.ndarray:
        if self._inner is not None:
            return self._inner.allowed()
        if self._free is None:
            self._free = np.zeros(self.n_logits, dtype=bool)
            self._free[: self.n_vocab] = True
        return self._free

    def forced(self) -> list[int]:
        return self._inner.forced() if self._inner is not None else []

    def fits(self, token: int) -> bool:
        return self._inner.fits(token) if self._inner is not None else True

    def accept(self, token: int) -> None:
        if self._inner is not None:
            self._inner.accept(token)
            return
        if self._abandoned or not 0 <= token < self.n_vocab:
            return
        self._tail += self._tokenizer.token_bytes(int(token))
        at = self._tail.find(self.trigger)
        if at < 0:
            self._tail = self._tail[-(len(self.trigger) - 1) :] if len(self.trigger) > 1 else b""
            return
        rest = self._tail[at + len(self.trigger) :]
        inner = Constraint(self.grammar, self._tokenizer, self.n_logits)
        ids = ll_tokenizer(self._tokenizer).tokenize_bytes(rest) if rest else []
        if inner.valid_prefix(ids) < len(ids):
            self._abandoned = True  # not a call after all: the text goes on unconstrained
            return
        inner.accept_all(ids)
        self._inner = inner

    def accept_all(self, tokens: list[int]) -> None:
        for t in tokens:
            self.accept(t)

    def reset(self) -> None:
        self._tail, self._inner, self._abandoned = b"", None, False
