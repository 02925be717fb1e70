"""`llamacy chat`: an interactive conversation in the terminal; in a pipe, one reply per input line.

On a terminal: a `> ` prompt with line editing and history (readline), replies streamed and rendered as
Markdown block by block (rich.live), a dim status line after each. Commands start with `/` (`/help`).
In a pipe (`printf 'q1\\nq2\\n' | llamacy chat`): each input line is a user turn; stdout carries only the
replies, each ending with a newline and separated by a blank line; notices go to stderr.

The conversation logic (history, KV reuse, overflow, save/load) is llamacy.chat.ChatSession.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import typer

from llamacy.cli import options as opt

HELP = """\
/help             this help
/reset            start a new conversation (the system prompt stays)
/system [TEXT]    show, or set, the system prompt ("/system -" removes it)
/save FILE        save the conversation as JSON messages
/load FILE        load a conversation saved with /save
/stats            tokens, context and speed
/json [SCHEMA|off] replies as JSON objects (on/off), or valid against a schema (a file or the JSON)
/exit             quit (also Ctrl-D)
A line ending in \\ continues on the next line; \"\"\" starts and ends a multi-line block.
Ctrl-C stops a reply (what was written stays in the conversation); at the prompt, twice to quit.
//text sends a message that starts with /."""

# \001 and \002 tell readline that the colour codes take no room on the line.
PROMPT = "\001\033[1;36m\002>\001\033[0m\002 "
CONTINUE = "\001\033[2m\002.\001\033[0m\002 "


class PlainStream:
    """A reply as bare text: streamed and flushed, blanks around it dropped, ends with exactly one newline."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.started = False
        self._blank = ""  # trailing whitespace held back until more text follows it

    def write(self, piece: str) -> None:
        if not self.started:
            piece = piece.lstrip()
            if not piece:
                return
            self.started = True
        text = self._blank + piece
        body = text.rstrip()
        self._blank = text[len(body) :]
        if body:
            self.out.write(body)
            self.out.flush()

    def end(self) -> None:
        self.out.write("\n")  # an empty reply is an empty line: one line group per input line
        self.out.flush()


class MarkdownStream:
    """A reply rendered as Markdown while it streams. Each finished block (text up to a blank line outside a
    code fence) is printed for good; only the block being written is live, so a long reply never asks the
    terminal to redraw more than one block (a block taller than the screen shows its top, then all of it once
    complete)."""

    REFRESH_S = 0.05

    def __init__(self, console: Any) -> None:
        self.console = console
        self.block = ""
        self.blocks = 0
        self.live: Any = None
        self._last = 0.0

    def write(self, piece: str) -> None:
        self.block += piece
        while (cut := _block_end(self.block)) is not None:
            done, self.block = self.block[:cut], self.block[cut:].lstrip("\n")
            self._show(done, final=True)
        if self.block.strip():
            self._show(self.block, final=False)

    def end(self) -> None:
        if self.block.strip():
            self._show(self.block, final=True)
        self.block = ""

    def _show(self, text: str, final: bool) -> None:
        from rich.live import Live
        from rich.markdown import Markdown

        if not text.strip():
            return
        if self.live is None:
            if self.blocks:
                self.console.print()
            self.live = Live(
                console=self.console, auto_refresh=False, vertical_overflow="ellipsis",
                redirect_stdout=False, redirect_stderr=False,
            )  # fmt: skip
            self.live.start()
        now = time.monotonic()
        if final or now - self._last >= self.REFRESH_S:  # re-rendering per token would cost more than a token
            self.live.update(_Trimmed(Markdown(text.strip())), refresh=True)
            self._last = now
        if final:
            self.live.stop()  # the last render shows the whole block
            self.live = None
            self.blocks += 1


class _Trimmed:
    """A renderable without blank lines at its top and bottom (Rich puts one above a list or a code block,
    which would open every reply that starts with one)."""

    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        lines = console.render_lines(self.renderable, options, pad=False)
        blank = lambda line: not "".join(seg.text for seg in line).strip()  # noqa: E731
        while lines and blank(lines[0]):
            lines.pop(0)
        while lines and blank(lines[-1]):
            lines.pop()
        for line in lines:
            yield from line
            yield Segment.line()


def _block_end(text: str) -> int | None:
    """Where the first finished Markdown block of text ends (after its blank line), outside code fences."""
    fence = False
    pos = 0
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fence = not fence
        elif not stripped and not fence and pos > 0 and line.endswith("\n") and text[:pos].strip():
            return pos + len(line)
        pos += len(line)
    return None


class ChatUI:
    """Reads messages and commands, shows replies. `interactive`: stdin is a terminal."""

    def __init__(self, session: Any, interactive: bool, markdown: bool) -> None:
        from rich.console import Console

        self.session = session
        self.interactive = interactive
        self.markdown = markdown
        self.out = Console(highlight=False) if markdown else None
        # Notes (status lines, notices) share the terminal with the replies; in a pipe they go to stderr.
        self.notes = self.out if (markdown and interactive) else Console(stderr=True, highlight=False)
        self.errors = 0
        self.replies = 0
        self._history_file: Path | None = None
        self.session_file: Path | None = None  # --session: saved after each turn

    # ---- output -------------------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.notes.print(text, style="dim", markup=False, soft_wrap=True)  # one line, whatever the width

    def error(self, text: str) -> None:
        self.errors += 1
        self.notes.print(f"error: {text}", style="red", markup=False, soft_wrap=True)

    # ---- input --------------------------------------------------------------------------------------------
    def _readline(self, prompt: str) -> str:
        """One line without its newline; EOFError at the end of input."""
        if self.interactive:
            return input(prompt)
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line[:-1] if line.endswith("\n") else line

    def read_message(self) -> str | None:
        """The next message: one line, lines joined by a trailing backslash, or a \"\"\" block. None at the end
        of input."""
        try:
            line = self._readline(PROMPT)
        except EOFError:
            return None
        if line.lstrip().startswith('"""'):
            body = line.lstrip()[3:]
            if len(body) >= 3 and body.endswith('"""'):
                return body[:-3]
            lines = [body] if body else []
            while True:
                try:
                    line = self._readline(CONTINUE)
                except EOFError:
                    break
                if line.rstrip().endswith('"""'):
                    lines.append(line.rstrip()[:-3])
                    break
                lines.append(line)
            return "\n".join(lines).strip("\n")
        lines = []
        while line.endswith("\\"):
            lines.append(line[:-1])
            try:
                line = self._readline(CONTINUE)
            except EOFError:
                line = ""
                break
        lines.append(line)
        return "\n".join(lines)

    def _setup_readline(self) -> None:
        try:
            import readline
        except ImportError:  # no line editing on this platform: input() still works
            return
        base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        self._history_file = Path(base) / "llamacy" / "chat_history"
        readline.set_history_length(1000)
        with contextlib.suppress(OSError):  # no history yet
            readline.read_history_file(self._history_file)

    def _save_readline(self) -> None:
        if self._history_file is None:
            return
        import readline

        try:
            self._history_file.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(self._history_file)
        except OSError:
            pass  # a read-only home is no reason to fail on exit

    # ---- the loop -----------------------------------------------------------------------------------------
    def run(self) -> int:
        if self.interactive:
            self._setup_readline()
        try:
            return self._loop()
        finally:
            if self.interactive:
                self._save_readline()

    def _loop(self) -> int:
        interrupted_at_prompt = False
        while True:
            try:
                text = self._read_while_idle()
            except KeyboardInterrupt:
                if not self.interactive:
                    raise
                if interrupted_at_prompt:
                    self.notes.print()
                    return 0
                interrupted_at_prompt = True
                self.notes.print()
                self.note("(Ctrl-C again, Ctrl-D or /exit to quit)")
                continue
            interrupted_at_prompt = False
            if text is None:
                if self.interactive:
                    self.notes.print()
                return 1 if self.errors and not self.interactive else 0
            if not text.strip():
                continue
            if text.startswith("/") and not text.startswith("//"):
                if self.command(text) == "exit":
                    return 0
                continue
            self.reply(text[1:] if text.startswith("//") else text)

    def _read_while_idle(self) -> str | None:
        """read_message; on a terminal, the model packs what its deferred repacking left (a MoE model's
        expert stacks among it) while the user types (Llama.idle): the replies after it read tiles."""
        if not self.interactive:
            return self.read_message()
        with self.session.llm.idle():
            return self.read_message()

    def reply(self, text: str) -> None:
        from llamacy.errors import LlamacyError

        s = self.session
        try:
            turn = s.send(text)
        except LlamacyError as e:
            self.error(str(e))
            return
        if turn.dropped:
            self.note(
                f"(context of {s.n_ctx} tokens full: dropped the oldest {turn.dropped} "
                f"message{'s' if turn.dropped != 1 else ''}; "
                f"{'the system prompt and the rest are' if s.system else 'the rest is'} kept)"
            )
        if self.replies and not self.interactive:  # a blank line between replies (a terminal has the prompt)
            sys.stdout.write("\n")
        stream: Any = MarkdownStream(self.out) if self.markdown else PlainStream(sys.stdout)
        self.replies += 1
        pieces = iter(turn)
        try:
            for piece in pieces:
                stream.write(piece)
        except KeyboardInterrupt:
            if not self.interactive:
                pieces.close()
                stream.end()
                raise
        except LlamacyError as e:
            pieces.close()
            stream.end()
            self.error(str(e))
            return
        finally:
            pieces.close()  # records the turn, also when interrupted
            self.save_session()
        stream.end()
        if self.interactive:
            self.status(turn)

    def save_session(self) -> None:
        from llamacy.errors import LlamacyError

        if self.session_file is None:
            return
        try:
            self.session.save_session(self.session_file)
        except (LlamacyError, OSError) as e:
            self.error(f"cannot save the session to {self.session_file}: {getattr(e, 'strerror', None) or e}")

    def status(self, turn: Any) -> None:
        s = self.session
        st = turn.stats
        parts = []
        if st is not None:
            parts.append(f"{st.gen_tokens} token{'s' if st.gen_tokens != 1 else ''}")
            if st.gen_tokens:
                parts.append(f"{st.gen_tps:.1f} tok/s")
        parts.append(f"context {s.context_used}/{s.n_ctx}")
        if turn.dropped and st is not None:
            parts.append(f"{st.prompt_evaluated} tokens read again after the drop")
        if turn.finish_reason == "interrupted":
            parts.append("interrupted" + ("; the partial reply is kept" if turn.text else ""))
        elif turn.finish_reason == "length":
            parts.append("cut: reply limit" if turn.max_tokens == s.max_tokens else "cut: context full")
        self.note("  " + " · ".join(parts))
        self.notes.print()

    # ---- commands -----------------------------------------------------------------------------------------
    def command(self, line: str) -> str | None:
        from llamacy.errors import LlamacyError

        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        s = self.session
        try:
            if name in ("/exit", "/quit", "/bye"):
                return "exit"
            if name in ("/help", "/?"):
                self.notes.print(HELP, markup=False, highlight=False)
            elif name == "/reset":
                s.reset()
                self.note("(new conversation)")
            elif name == "/system":
                if not arg:
                    self.note(f"system prompt: {s.system}" if s.system else "(no system prompt)")
                else:
                    s.set_system(None if arg == "-" else arg)
                    self.note("(system prompt removed)" if arg == "-" else "(system prompt set)")
            elif name == "/save":
                if not arg:
                    raise _usage("/save needs a file name")
                s.save(arg)
                self.note(f"(saved {len(s.messages)} messages to {arg})")
            elif name == "/load":
                if not arg:
                    raise _usage("/load needs a file name")
                s.load(arg)
                self.note(f"(loaded {len(s.messages)} messages from {arg})")
            elif name == "/stats":
                self.stats()
            elif name == "/json":
                self.json_mode(arg)
            else:
                self.error(f"unknown command {name} (/help lists them)")
        except LlamacyError as e:
            self.error(str(e))
        return None

    def json_mode(self, arg: str) -> None:
        """/json toggles JSON-object replies; /json SCHEMA (file or JSON text) sets a schema; /json off."""
        from llamacy.structured.grammar import cli_grammar

        s = self.session
        if arg in ("off", "-") or (not arg and s.grammar is not None):
            s.grammar = None
            self.note("(replies are free text)")
            return
        s.grammar = cli_grammar(json_object=not arg, json_schema=arg or None)  # UsageError: shown, mode kept
        self.note("(replies are JSON objects)" if not arg else "(replies follow the JSON schema)")

    def stats(self) -> None:
        s = self.session
        llm = s.llm
        lines = [
            f"model          {llm.model_path.name}",
            f"chat template  {s.template.describe().removeprefix('chat template: ')}",
            f"messages       {len(s.messages)} ({s.turns} turns this session)",
            f"context        {s.context_used} of {s.n_ctx} tokens",
            f"evaluated      {s.evaluated} prompt tokens, generated {s.generated} tokens",
        ]
        if s.last is not None and s.last.stats is not None:
            st = s.last.stats
            lines.append(
                f"last reply     prompt {st.prompt_evaluated} of {st.prompt_tokens} tokens evaluated "
                f"({st.prompt_tps:.1f} tok/s), {st.gen_tokens} generated ({st.gen_tps:.1f} tok/s)"
            )
        for line in lines:
            self.note(line)


def _usage(msg: str) -> Exception:
    from llamacy.errors import UsageError

    return UsageError(msg)


@opt.sampling_options
@opt.speculation_options
def chat(
    model: str = opt.MODEL,
    system: str = typer.Option(None, "--system", help="The system prompt."),
    chat_template: Path = typer.Option(
        None, "--chat-template", help="A Jinja chat template file, instead of the model's own."
    ),
    predict: int = typer.Option(
        -1, "--predict", "-n", help="Tokens per reply at most; -1 = until the model stops."
    ),
    ctx_size: int = opt.CTX,
    kv_type: str = opt.KV_TYPE,
    threads: int = opt.THREADS,
    spec: dict[str, Any] = opt.SPECULATION,
    sampling: dict[str, Any] = opt.SAMPLING,
    session_file: Path = typer.Option(
        None,
        "--session",
        help="Keep the conversation and its memory in this file: resumed at start, saved after each turn.",
    ),
) -> None:
    opt.check_counts(threads, ctx_size, predict)
    interactive = sys.stdin.isatty()
    markdown = sys.stdout.isatty()
    if not interactive:  # invalid UTF-8 in piped input becomes U+FFFD, as in `llamacy run`
        sys.stdin.reconfigure(errors="replace")

    from llamacy.chat import ChatSession
    from llamacy.chat_template import ChatTemplate
    from llamacy.engine import Llama

    loading: Any = contextlib.nullcontext()
    if interactive and markdown:
        from rich.console import Console

        loading = Console().status("[dim]loading the model…[/dim]", spinner="dots")
    with loading:
        llm = Llama(model, n_ctx=ctx_size, n_threads=threads, kv_type=kv_type)
    template = ChatTemplate.from_model(llm.metadata, llm.tokenizer, override=chat_template)
    session = ChatSession(llm, template, system=system, max_tokens=predict, **spec, **sampling)
    ui = ChatUI(session, interactive=interactive, markdown=markdown)
    if session_file is not None:
        if session_file.exists():
            session.load_session(session_file)  # a mismatched or damaged file fails in one line
            ui.note(f"(resumed {len(session.messages)} messages from {session_file})")
        ui.session_file = session_file
    if interactive:
        ui.note(f"{llm.model_path.name} · context {llm.n_ctx} tokens · {template.describe()}")
        ui.note("/help for commands · Ctrl-D to quit · end a line with \\ to write more lines")
    elif template.builtin:
        ui.note(template.describe())
    code = ui.run()
    if code:
        raise typer.Exit(code)
