"""Which replica a request should go to: the one that last served the longest prefix of its prompt, so
that the scheduler's KV prefix reuse (same conversation, same system prompt) keeps working across
replicas; the least loaded one when none did or when that one is much busier than the others.

A prompt is cut into blocks of BLOCK_CHARS characters and each block's running hash names the prefix that
ends there (the ingress computes them: prefix_hashes). The router remembers, per prefix hash, the replica
that served it last (bounded, least recently used forgotten first).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

BLOCK_CHARS = 64  # about 16 tokens: a shared prefix shorter than this saves little prefill
MAX_BLOCKS = 64  # prefixes beyond 4096 characters all count as the same prefix
REMEMBERED = 100_000  # prefix hashes the router keeps


def prompt_text(body: bytes) -> str | None:
    """The text a generation request starts from: a completion's prompt, or a chat's messages in order
    (role and content), so that a conversation's next turn extends the previous turn's text. None when
    the body carries no prompt (or is not JSON: the replica will say so)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    model = str(obj.get("model") or "")
    messages = obj.get("messages")
    if isinstance(messages, list):
        parts = [model]
        for m in messages:
            if isinstance(m, dict):
                parts.append(f"\x1e{m.get('role', '')}\x1f{_content_text(m.get('content'))}")
        return "".join(parts)
    prompt = obj.get("prompt")
    if isinstance(prompt, str):
        return model + "\x1e" + prompt
    if isinstance(prompt, list) and prompt:
        # Token ids, or several prompts: the first one decides (a list of ids is its own prefix).
        first = prompt[0]
        return model + "\x1e" + (first if isinstance(first, str) else json.dumps(prompt))
    return None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def prefix_hashes(text: str | None) -> tuple[str, ...]:
    """Running hashes of the text's whole blocks (and of the text itself when shorter than one block)."""
    if not text:
        return ()
    h = hashlib.blake2b(digest_size=8)
    n = min(len(text) // BLOCK_CHARS, MAX_BLOCKS)
    if n == 0:
        h.update(text.encode("utf-8", "surrogatepass"))
        return (h.hexdigest(),)
    out = []
    for i in range(n):
        h.update(text[i * BLOCK_CHARS : (i + 1) * BLOCK_CHARS].encode("utf-8", "surrogatepass"))
        out.append(h.hexdigest())  # hexdigest does not finalize: the hash keeps running
    return tuple(out)


class PrefixMemory:
    """Prefix hash -> the replica that served it last, least recently used forgotten first."""

    def __init__(self, capacity: int = REMEMBERED) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[str, str] = OrderedDict()

    def best(self, hashes: tuple[str, ...], alive: set[str]) -> str | None:
        """The live replica that served the longest of these prefixes."""
        for h in reversed(hashes):
            owner = self._owner.get(h)
            if owner is not None and owner in alive:
                self._owner.move_to_end(h)
                return owner
        return None

    def remember(self, hashes: tuple[str, ...], replica: str) -> None:
        for h in hashes:
            self._owner[h] = replica
            self._owner.move_to_end(h)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def forget_replica(self, replica: str) -> None:
        for h in [h for h, r in self._owner.items() if r == replica]:
            del self._owner[h]
