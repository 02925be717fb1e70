"""Stop strings that may arrive split across tokens: hold back text that could still become one."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str] | tuple[str, ...] = ()) -> None:
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text (Anthropic reports it)

    def feed(self, text: str) -> str:
        """Add generated text; return what is safe to show now. After a stop string, nothing more."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._pending + text
        hits = [(buf.find(s), s) for s in self.stops]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            at, self.matched = min(hits, key=lambda h: (h[0], len(h[1])))  # the first to complete
            return buf[:at]
        # Keep the longest tail of buf that is a prefix of some stop string.
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation, release held-back text (it never became a stop string)."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out
