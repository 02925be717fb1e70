"""Where generated text goes: Rich on a terminal, plain flushed text in a pipe; stats to stderr."""

from __future__ import annotations

import sys
from typing import Any


class CompletionWriter:
    """Streams a completion. Pipes get the bare text, flushed per piece; terminals get Rich styling."""

    def __init__(self, echo: bool | None = None) -> None:
        self.tty = sys.stdout.isatty()
        self.echo = self.tty if echo is None else echo
        self.console: Any = None
        if self.tty:
            from rich.console import Console

            self.console = Console(highlight=False, soft_wrap=True)
        self._ended_with_newline = True

    def prompt(self, text: str) -> None:
        if not self.echo:
            return
        if self.console is not None:
            self.console.print(text, style="dim", end="", markup=False)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    def write(self, piece: str) -> None:
        if not piece:
            return
        if self.console is not None:
            self.console.print(piece, end="", markup=False)
        else:
            sys.stdout.write(piece)
            sys.stdout.flush()
        self._ended_with_newline = piece.endswith("\n")

    def end(self) -> None:
        # A terminal prompt should start on its own line; a pipe gets exactly what the model wrote.
        if self.console is not None and not self._ended_with_newline:
            self.console.print()


def print_stats(llm: Any) -> None:
    from rich.console import Console

    c = llm.last
    if c is None:
        return
    st = c.stats
    err = Console(stderr=True, highlight=False)
    drafts = f"drafted {st.draft_tokens} tok, accepted {st.draft_accepted} · " if st.draft_tokens else ""
    err.print(
        f"[dim]load {st.load_s * 1000:.0f} ms · prompt {st.prompt_evaluated} tok in {st.prompt_s * 1000:.0f} ms "
        f"({st.prompt_tps:.1f} tok/s) · generated {st.gen_tokens} tok in {st.gen_s * 1000:.0f} ms "
        f"({st.gen_tps:.1f} tok/s) · {drafts}first token {st.first_token_s * 1000:.0f} ms · "
        f"finish: {c.finish_reason}[/dim]"
    )


def print_profile(stats: Any) -> None:
    """Where the time went, per stage, on stderr (from Llama(profile=True))."""
    from rich.console import Console
    from rich.table import Table

    prof = stats.profile
    total = sum(prof.values()) or 1e-12
    per = max(stats.gen_tokens, 1)
    t = Table(title=f"profile: {stats.prompt_evaluated} prompt + {stats.gen_tokens} generated tokens")
    t.add_column("stage")
    t.add_column("total ms", justify="right")
    t.add_column("ms / generated token", justify="right")
    t.add_column("share", justify="right")
    for name, sec in sorted(prof.items(), key=lambda kv: -kv[1]):
        t.add_row(name, f"{sec * 1000:.1f}", f"{sec * 1000 / per:.3f}", f"{100 * sec / total:.1f}%")
    t.add_row("total", f"{total * 1000:.1f}", f"{total * 1000 / per:.3f}", "100%", style="bold")
    Console(stderr=True, highlight=False).print(t)
