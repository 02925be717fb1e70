"""A chat session: the conversation, kept in the model's KV cache between turns. No terminal code here.

    session = ChatSession(llm, system="Be brief.", max_tokens=-1, temperature=0)
    turn = session.send("Name the capital of France.")
    for piece in turn:                       # streams the reply; the turn is then in session.messages
        print(piece, end="")
    turn.stats.prompt_evaluated              # tokens evaluated for this turn (the rest came from the cache)

How the cache is reused: the token ids of the conversation so far (prompt + the reply's generated tokens) are
kept. The next prompt is the previous ids plus the tokens of only the new text (the template's end-of-turn
glue, the user message, the next turn opener), so the engine's common-prefix reuse evaluates just those.
When the template rewrites history (e.g. trims a reply) the whole conversation is tokenized again and the
engine still reuses the longest common prefix.

When the conversation outgrows the context, the oldest turns are dropped (never the system prompt) and what
is kept is evaluated again; the cached system prompt prefix is still reused. The reply is capped so that
prompt + reply fit the context.

Ctrl-C during a reply: the partial reply stays in the conversation (the user saw it and the cache holds it);
if nothing was generated yet, the user message is dropped too, so the conversation keeps alternating.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llamacy.chat_template import ChatTemplate
from llamacy.errors import ContextOverflowError, UsageError

ROLES = ("system", "user", "assistant")


def check_messages(data: Any, source: str = "messages") -> list[dict[str, str]]:
    """Validate a saved conversation: a JSON list of {"role", "content"} (or {"messages": [...]})."""
    if isinstance(data, dict) and "messages" in data:
        data = data["messages"]
    if not isinstance(data, list):
        raise UsageError(f"{source}: expected a JSON list of messages")
    out = []
    for i, m in enumerate(data):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise UsageError(f"{source}: message {i} needs a role ({', '.join(ROLES)}) and a text content")
        if m["role"] == "system" and i != 0:
            raise UsageError(f"{source}: only the first message may be a system message")
        out.append({"role": m["role"], "content": m["content"]})
    return out


class Turn:
    """One user message and its reply. Iterate it to generate the reply (text pieces as they come); when the
    iteration ends, normally or not, the turn is part of the conversation."""

    def __init__(
        self, session: ChatSession, user: str, prompt: str, ids: list[int], dropped: int, max_tokens: int
    ) -> None:
        self.session = session
        self.user = user
        self.prompt = prompt  # the rendered conversation, ending where the reply begins
        self.ids = ids  # the prompt as token ids
        self.dropped = dropped  # messages dropped from the start of the conversation to make room
        self.max_tokens = max_tokens  # the reply's cap: the -n limit or what is left of the context
        self.text = ""
        self.tokens: list[int] = []
        self.finish_reason: str | None = None  # "stop", "length" or "interrupted"
        self.stats: Any = None  # the engine's Stats (prompt_evaluated, gen_tokens, gen_tps, ...)
        self._started = False

    def __iter__(self) -> Iterator[str]:
        if self._started:
            raise RuntimeError("a turn is generated once")
        self._started = True
        s = self.session
        llm, tpl = s.llm, s.template
        if self.dropped:
            del s.history[: self.dropped]
        before = llm.last
        completed = False
        gen = llm.generate_tokens(
            self.ids, max_tokens=self.max_tokens, stop=tpl.stop_strings, grammar=s.grammar, **s.sampling
        )
        try:
            for tok, piece in gen:
                if tok in tpl.stop_ids:
                    # An end-of-turn token the engine does not know as one (e.g. <start_of_turn>): never shown.
                    self.finish_reason = "stop"
                    break
                self.text += piece
                yield piece
            completed = True
        finally:
            gen.close()
            last = llm.last
            if last is not None and last is not before:
                self.stats = last.stats
                self.tokens = list(last.tokens)
                if self.finish_reason is None:
                    self.finish_reason = last.finish_reason if completed else "interrupted"
            else:  # interrupted before the engine started this turn
                self.finish_reason = "interrupted"
            s._finish(self)


class ChatSession:
    """A conversation with one model. `history` holds user/assistant messages; the system prompt is apart
    so that no overflow policy can lose it."""

    def __init__(
        self,
        llm: Any,
        template: ChatTemplate | None = None,
        system: str | None = None,
        max_tokens: int = -1,
        **sampling: Any,
    ) -> None:
        self.llm = llm
        self.template = template or ChatTemplate.from_model(llm.metadata, llm.tokenizer)
        self.history: list[dict[str, str]] = []
        self.max_tokens = max_tokens  # per reply; -1 = until the model stops or the context is full
        self.sampling = sampling
        self.grammar: Any = None  # a llamacy.structured Grammar that replies must follow (chat's /json)
        self._check_system(system)
        self.system = system or None
        # What the cache holds after the last turn: its token ids and, when they decode exactly to it, the
        # text they stand for (None: re-tokenize the next prompt in full).
        self._ids: list[int] = []
        self._text: str | None = None
        self.turns = 0
        self.evaluated = 0  # prompt tokens evaluated over the session
        self.generated = 0
        self.last: Turn | None = None

    # ---- the conversation -------------------------------------------------------------------------------
    @property
    def messages(self) -> list[dict[str, str]]:
        """The whole conversation as the template sees it."""
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    @property
    def n_ctx(self) -> int:
        return self.llm.n_ctx

    @property
    def context_used(self) -> int:
        """Tokens of the conversation now in the context (prompt + reply of the last turn)."""
        return len(self._ids)

    def reset(self) -> None:
        """A new conversation with the same system prompt (its cached tokens are reused)."""
        self.history = []
        self._forget()

    def set_system(self, text: str | None) -> None:
        self._check_system(text)
        self.system = text or None
        self._forget()

    def load_messages(self, messages: list[dict[str, str]]) -> None:
        messages = check_messages(messages)
        if messages and messages[0]["role"] == "system":
            self._check_system(messages[0]["content"])
        self.template.render(messages)  # a conversation the template refuses is refused now, not every turn
        if messages and messages[0]["role"] == "system":
            self.system, messages = messages[0]["content"], messages[1:]
        self.history = messages
        self._forget()

    def save(self, path: str | Path) -> None:
        try:
            Path(path).write_text(
                json.dumps(self.messages, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
            )
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror}") from None

    def load(self, path: str | Path) -> None:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"{path} is not a JSON conversation: {e}") from None
        self.load_messages(check_messages(data, str(path)))

    def save_session(self, path: str | Path) -> int:
        """Save the conversation and its memory (llamacy/model/memory_file.py) to one file, so that
        load_session in another process continues it evaluating only the new turn."""
        extra = {"messages": self.messages, "ids": self._ids, "text": self._text}
        return self.llm.save_memory(path, extra=extra)

    def load_session(self, path: str | Path) -> None:
        """Continue a conversation saved with save_session: its messages, and its memory in the cache. A file
        of another model or KV type, or a damaged one, is refused (MemoryFileError) and nothing changes."""
        from llamacy.model.memory_file import MemoryFileError, read_memory_header

        extra = read_memory_header(path).get("extra")
        if not isinstance(extra, dict):
            raise MemoryFileError(f"{path}: not a chat session file (no conversation)")
        messages = check_messages(extra.get("messages"), str(path))
        ids, text = extra.get("ids"), extra.get("text")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise MemoryFileError(f"{path}: not a chat session file (no conversation ids)")
        saved = (self.history, self.system)
        self.load_messages(messages)
        try:
            self.llm.load_memory(path)
        except BaseException:
            self.history, self.system = saved
            raise
        self._ids = ids
        self._text = text if isinstance(text, str) else None

    # ---- a turn -----------------------------------------------------------------------------------------
    def reserve(self) -> int:
        """Room kept for a reply when deciding what history fits."""
        n = self.n_ctx
        want = self.max_tokens if self.max_tokens > 0 else n // 4
        return max(1, min(want, n // 2))

    def send(self, text: str) -> Turn:
        """Prepare the reply to a user message: the prompt, after dropping the oldest turns if it does not fit.
        Raises ContextOverflowError when the message alone (with the system prompt) does not fit."""
        history = [*self.history, {"role": "user", "content": text}]
        drop = 0
        while True:
            prompt, ids = self._prompt(history[drop:], incremental=drop == 0)
            if len(ids) + self.reserve() <= self.n_ctx:
                break
            if drop + 1 >= len(history):  # only the new message is left: reply in what remains, if anything
                if len(ids) < self.n_ctx:
                    break
                raise ContextOverflowError(
                    f"the message needs {len(ids)} tokens with the system prompt and template, but the context "
                    f"holds {self.n_ctx} (shorten it, or raise --ctx-size)"
                )
            drop += 1
            while drop + 1 < len(history) and history[drop]["role"] != "user":
                drop += 1  # the kept part starts with a user message, as templates expect
        room = self.n_ctx - len(ids)
        max_tokens = room if self.max_tokens < 0 else min(self.max_tokens, room)
        return Turn(self, text, prompt, ids, drop, max_tokens)

    def _prompt(self, history: list[dict[str, str]], incremental: bool) -> tuple[str, list[int]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        text = self.template.render(system + history, add_generation_prompt=True)
        if incremental and self._text is not None and text.startswith(self._text):
            # Only the new text is tokenized: the cached ids (the reply as generated) stay as they are.
            new = self.template.tokenizer.encode(text[len(self._text) :], add_bos=False, special=True)
            return text, self._ids + new
        return text, self.template.encode(text)

    def _forget(self) -> None:
        """The conversation changed: the next prompt is tokenized in full (the engine still reuses whatever
        prefix of it the cache holds, e.g. the system prompt)."""
        self._ids = []
        self._text = None

    def _finish(self, turn: Turn) -> None:
        """Record a turn that was generated (or interrupted) in the conversation and the cache bookkeeping."""
        self.last = turn
        self.turns += 1
        if turn.stats is not None:
            self.evaluated += turn.stats.prompt_evaluated
            self.generated += turn.stats.gen_tokens
        if turn.finish_reason == "interrupted" and not turn.text:
            self._forget()  # nothing answered: the message is dropped
            return
        self.history += [{"role": "user", "content": turn.user}, {"role": "assistant", "content": turn.text}]
        self._ids = turn.ids + turn.tokens
        # The incremental path needs the cached ids to spell exactly the prompt + the reply as recorded; a stop
        # string, an end token caught here, or a character cut by Ctrl-C break that, and then the next prompt
        # is tokenized in full (the engine still reuses the common prefix).
        dec = self.template.tokenizer.stream_decoder()
        clean = "".join(dec.feed(t) for t in turn.tokens) + dec.flush() == turn.text
        self._text = turn.prompt + turn.text if clean else None

    def _check_system(self, text: str | None) -> None:
        """Refuse a system prompt that leaves no room for a conversation (before it replaces the old one)."""
        if not text:
            return
        probe = [{"role": "system", "content": text}, {"role": "user", "content": ""}]
        n = len(self.template.encode(self.template.render(probe)))
        if n + self.reserve() > self.n_ctx:
            raise ContextOverflowError(
                f"the system prompt takes {n} tokens, too many for a context of {self.n_ctx} "
                f"with room for a reply (shorten it, or raise --ctx-size)"
            )
