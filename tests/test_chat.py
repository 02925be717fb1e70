"""`llamacy chat`: the session (KV reuse per turn, overflow policy, Ctrl-C, save/load) on tiny random models,
the command in a pipe and on a pseudo-terminal, and real answers from the default model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.chat import ChatSession
from llamacy.errors import ContextOverflowError, UsageError

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "\x1b[1;36m>\x1b[0m "  # the chat prompt as the terminal receives it (colour codes included)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    """A tiny llama model with a ChatML vocabulary and template, 128 tokens of context."""
    from tests.model_factory import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("chat") / "tiny.gguf", arch="llama", wtype=QT.Q8_0)


@pytest.fixture(scope="module")
def tiny_llm(tiny_path):
    from llamacy import Llama

    return Llama(tiny_path, n_threads=1)


@pytest.fixture(scope="module")
def smollm(default_model_path):
    from llamacy import Llama

    return Llama(default_model_path, n_ctx=1024, n_threads=2)


def run_turn(session: ChatSession, text: str):
    turn = session.send(text)
    for _ in turn:
        pass
    return turn


# ---- the session ------------------------------------------------------------------------------------------


def test_each_turn_evaluates_only_the_new_tokens(tiny_llm):
    s = ChatSession(tiny_llm, system="Be brief.", max_tokens=6, temperature=0)
    t1 = run_turn(s, "hello there")
    assert t1.stats.prompt_evaluated == len(t1.ids) > 10  # a fresh cache: the whole prompt
    t2 = run_turn(s, "and then")
    cached = len(t1.ids) + len(t1.tokens)
    assert t2.ids[:cached] == t1.ids + t1.tokens  # the conversation so far, as generated
    new = len(t2.ids) - cached
    # Only the new user message and template glue (+ the last reply token, never evaluated at a length stop).
    assert t2.stats.prompt_evaluated <= new + 1 < len(t2.ids) // 2
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert s.messages[2]["content"] == t1.text


def test_kv_reuse_on_the_default_model(smollm):
    s = ChatSession(smollm, temperature=0)
    counts = []
    for q in ["Name the capital of France.", "And of Germany?", "What did I ask first?"]:
        t = run_turn(s, q)
        counts.append((t.stats.prompt_evaluated, t.stats.prompt_tokens))
    print("evaluated / prompt tokens per turn:", counts)
    assert counts[0][0] == counts[0][1]
    for evaluated, total in counts[1:]:
        assert evaluated <= 20 and total >= 50  # the new message + glue, not the whole history


def test_overflow_drops_oldest_turns_never_the_system_prompt(tiny_llm):
    s = ChatSession(tiny_llm, system="SYSTEM PROMPT", max_tokens=12, temperature=0)
    dropped = []
    for i in range(8):
        t = run_turn(s, f"question number {i} is about the capital of France")
        dropped.append(t.dropped)
        assert len(t.ids) + t.max_tokens <= s.n_ctx  # prompt + reply always fit
        assert t.max_tokens == 12
        assert s.messages[0] == {"role": "system", "content": "SYSTEM PROMPT"}
        assert s.history[0]["role"] == "user"
        assert "SYSTEM PROMPT" in t.prompt and f"question number {i} " in t.prompt
    assert any(dropped)
    first_drop = next(i for i, d in enumerate(dropped) if d)
    assert "question number 0 " not in s.template.render(s.messages)
    # After a drop, what is kept is evaluated again, but the cached system prompt prefix is still reused.
    assert len(s.history) < 2 * 8 and first_drop > 0


def test_a_message_too_long_for_the_context_is_refused_and_the_session_goes_on(tiny_llm):
    s = ChatSession(tiny_llm, max_tokens=4, temperature=0)
    run_turn(s, "hello")
    with pytest.raises(ContextOverflowError, match="context holds 128"):
        s.send("the capital of France " * 60)
    assert len(s.history) == 2
    run_turn(s, "hello again")
    assert len(s.history) == 4


def test_reply_is_capped_to_what_is_left_of_the_context(tiny_llm):
    s = ChatSession(tiny_llm, max_tokens=-1, temperature=0)
    t = s.send("the capital of France " * 12)
    assert t.max_tokens == s.n_ctx - len(t.ids)
    for _ in t:
        pass
    assert len(t.ids) + t.stats.gen_tokens <= s.n_ctx


def test_system_prompt_that_cannot_fit_is_refused_and_the_old_one_kept(tiny_llm):
    with pytest.raises(ContextOverflowError, match="system prompt"):
        ChatSession(tiny_llm, system="Paris " * 200)
    s = ChatSession(tiny_llm, system="Be brief.")
    with pytest.raises(ContextOverflowError):
        s.set_system("Paris " * 200)
    assert s.system == "Be brief."


def test_interrupted_reply_keeps_the_partial_text(tiny_llm):
    s = ChatSession(tiny_llm, max_tokens=20, temperature=0)
    turn = s.send("hello")
    pieces = iter(turn)
    got = "".join(next(pieces) for _ in range(3))
    pieces.close()  # what the terminal does on Ctrl-C
    assert turn.finish_reason == "interrupted"
    assert s.history == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": got}]
    t2 = run_turn(s, "again")
    assert t2.finish_reason in ("stop", "length") and len(s.history) == 4


def test_interrupt_before_any_text_drops_the_message(tiny_llm, monkeypatch):
    s = ChatSession(tiny_llm, max_tokens=4, temperature=0)
    run_turn(s, "hello")

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(tiny_llm.model, "eval_batch", ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            run_turn(s, "this one is interrupted during the prompt")
    assert [m["content"] for m in s.history if m["role"] == "user"] == ["hello"]
    t = run_turn(s, "next")
    assert t.finish_reason in ("stop", "length")


def test_reset_keeps_the_system_prompt_and_its_cache(tiny_llm):
    s = ChatSession(tiny_llm, system="Be brief.", max_tokens=4, temperature=0)
    run_turn(s, "hello")
    s.reset()
    assert s.messages == [{"role": "system", "content": "Be brief."}]
    t = run_turn(s, "hi")
    assert t.stats.prompt_evaluated < len(t.ids)  # the system prompt came from the cache


def test_save_and_load(tiny_llm, tmp_path):
    s = ChatSession(tiny_llm, system="Be brief.", max_tokens=4, temperature=0)
    run_turn(s, "hello é")
    f = tmp_path / "conv.json"
    s.save(f)
    saved = json.loads(f.read_text(encoding="utf-8"))
    assert saved == s.messages and saved[1] == {"role": "user", "content": "hello é"}
    other = ChatSession(tiny_llm, max_tokens=4, temperature=0)
    other.load(f)
    assert other.messages == s.messages and other.system == "Be brief."
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "wizard", "content": "x"}]')
    with pytest.raises(UsageError, match="needs a role"):
        other.load(bad)
    bad.write_text("not json")
    with pytest.raises(UsageError, match="not a JSON conversation"):
        other.load(bad)
    with pytest.raises(UsageError, match="cannot read"):
        other.load(tmp_path / "missing.json")
    assert other.messages == s.messages  # a failed load changes nothing


# ---- the command in a pipe --------------------------------------------------------------------------------


def llamacy(*args: str, input: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LLAMACY_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "llamacy", "chat", *args],
        input=input,
        capture_output=True,
        timeout=timeout,
        env=env,
    )


def test_pipe_prints_only_the_replies(tiny_path, tiny_llm):
    args = ("-m", str(tiny_path), "--temp", "0", "-n", "6", "-t", "1")
    r = llamacy(*args, input=b"hello there\n\nand then\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    s = ChatSession(tiny_llm, max_tokens=6, temperature=0)
    want = [run_turn(s, q).text.strip() for q in ("hello there", "and then")]
    assert r.stdout.decode() == f"{want[0]}\n\n{want[1]}\n"


def test_pipe_commands_and_multiline_input(tiny_path, tmp_path):
    f = tmp_path / "conv.json"
    script = f'/system Be brief.\nfirst \\\nsecond\n"""\nthird\nfourth\n"""\n/save {f}\n/system -\n/system\n'
    r = llamacy("-m", str(tiny_path), "--temp", "0", "-n", "3", "-t", "1", input=script.encode())
    assert r.returncode == 0, r.stderr
    messages = json.loads(f.read_text())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == "Be brief."
    assert messages[1]["content"] == "first \nsecond"
    assert messages[3]["content"] == "third\nfourth"
    assert r.stderr.decode().splitlines()[-2:] == ["(system prompt removed)", "(no system prompt)"]


def test_pipe_errors_are_one_line_on_stderr(tiny_path, tmp_path):
    r = llamacy("-m", str(tiny_path), "-n", "2", "-t", "1", input=b"/load nowhere.json\n/bogus\n")
    assert r.returncode == 1 and r.stdout == b""
    err = r.stderr.decode().splitlines()
    assert len(err) == 2 and "cannot read nowhere.json" in err[0] and "unknown command /bogus" in err[1]
    r = llamacy("-m", str(tiny_path), "--chat-template", str(tmp_path / "none.jinja"), input=b"hi\n")
    assert r.returncode == 2 and "cannot read chat template" in r.stderr.decode()


def test_pipe_long_conversation_drops_old_turns_with_a_notice(tiny_path):
    lines = "".join(f"question number {i} is about the capital of France\n" for i in range(8))
    args = ("-m", str(tiny_path), "--temp", "0", "-n", "12", "-t", "1", "--system", "Be brief.")
    r = llamacy(*args, input=lines.encode())
    assert r.returncode == 0, r.stderr
    notices = r.stderr.decode().splitlines()
    assert notices and all("dropped the oldest" in n and "system prompt" in n for n in notices)
    assert len(r.stdout.decode().split("\n\n")) == 8  # one reply per input line


def test_plain_stream_and_markdown_blocks():
    import io

    from llamacy.cli.chat import PlainStream, _block_end

    out = io.StringIO()
    p = PlainStream(out)
    for piece in ["\n", " Hello", " world", "\n\n", "  ", "again", "\n"]:
        p.write(piece)
    p.end()
    assert out.getvalue() == "Hello world\n\n  again\n"
    assert _block_end("para one\n\npara two") == len("para one\n\n")
    assert _block_end("```\ncode\n\nmore code\n") is None  # a blank line inside a fence ends nothing
    assert _block_end("```\ncode\n\n```\n\nafter") == len("```\ncode\n\n```\n\n")
    assert _block_end("\n\nstart") is None


def test_default_model_names_paris(default_model_path):
    r = llamacy(
        "-m", str(default_model_path), "--temp", "0", "-t", "2", input=b"Name the capital of France.\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    assert "Paris" in r.stdout.decode()
    assert r.stdout.decode() == "The capital of France is Paris.\n"  # the reference engine's answer


@pytest.mark.slow
def test_gemma_answers_through_its_builtin_template(gemma_model_path):
    from llamacy import Llama
    from llamacy.errors import UnsupportedModelError

    try:
        Llama(gemma_model_path, n_ctx=64, n_threads=1)
    except UnsupportedModelError as e:
        pytest.skip(f"Gemma 3 does not load yet: {e}")
    r = llamacy("-m", str(gemma_model_path), "--temp", "0", "-n", "12", "-c", "256", "-t", "2",
                input=b"Name the capital of France.\n")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "built-in gemma" in r.stderr.decode()  # the one dim line that says which template
    out = r.stdout.decode()
    assert out.strip() and "<end_of_turn>" not in out and "<start_of_turn>" not in out


# ---- the command on a terminal ----------------------------------------------------------------------------


def spawn(*args: str, tmp_path: Path):
    pexpect = pytest.importorskip("pexpect")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path), "TERM": "xterm-256color"}
    env.pop("LLAMACY_DEBUG", None)
    child = pexpect.spawn(
        sys.executable, ["-m", "llamacy", "chat", *args], env=env, encoding="utf-8", timeout=120,
        dimensions=(40, 120),
    )  # fmt: skip
    child.expect_exact(PROMPT)
    return child


def test_terminal_session(tiny_path, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    c = spawn("-m", str(tiny_path), "--temp", "0", "-n", "5", "-t", "1", tmp_path=tmp_path)
    assert "chat template: the model's own" in c.before
    c.sendline("hello there")
    c.expect(r"tokens? .*context \d+/128")  # the status line
    c.expect_exact(PROMPT)
    c.sendline("/help")
    c.expect_exact("/reset")
    c.expect_exact(PROMPT)
    c.sendline("/stats")
    c.expect(r"context +\d+ of 128 tokens")
    c.expect_exact(PROMPT)
    c.sendline("/reset")
    c.expect_exact("(new conversation)")
    c.expect_exact(PROMPT)
    c.sendintr()  # Ctrl-C at the prompt asks; a second one quits
    c.expect_exact("Ctrl-C again")
    c.expect_exact(PROMPT)
    c.sendintr()
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0
    history = (tmp_path / "llamacy" / "chat_history").read_text().splitlines()
    assert history[-4:] == ["hello there", "/help", "/stats", "/reset"]  # for the arrow keys next time


def test_terminal_ctrl_d_quits_and_history_is_saved(tiny_path, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    c = spawn("-m", str(tiny_path), "-n", "2", "-t", "1", tmp_path=tmp_path)
    c.sendline("/system Be brief.")
    c.expect_exact("(system prompt set)")
    c.expect_exact(PROMPT)
    c.sendeof()
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0
    assert "/system Be brief." in (tmp_path / "llamacy" / "chat_history").read_text()


@pytest.mark.slow
def test_terminal_ctrl_c_stops_a_reply_and_keeps_the_session(default_model_path, tmp_path):
    c = spawn("-m", str(default_model_path), "--temp", "0", "-t", "2", tmp_path=tmp_path)
    c.sendline("Write a long story about a dragon who learns to cook.")
    c.expect_exact("cook.\r\n")  # the echo of the input line
    c.expect(r"\w+ \w+ \w+")  # the reply has started
    c.sendintr()
    c.expect_exact("interrupted; the partial reply is kept")
    c.expect_exact(PROMPT)
    c.sendline("/stats")
    c.expect(r"messages +2 ")
    c.expect_exact(PROMPT)
    c.sendline("/exit")
    c.expect(__import__("pexpect").EOF)
    c.close()
    assert c.exitstatus == 0


def test_a_terminal_reads_each_message_while_the_model_packs(monkeypatch):
    """On a terminal the chat reads each message inside Llama.idle, so the model packs what its deferred
    repacking left (a MoE model's expert stacks) while the user types; from a pipe it reads at once."""
    import contextlib
    from types import SimpleNamespace

    from llamacy.cli.chat import ChatUI

    events: list[str] = []

    class Llm:
        @contextlib.contextmanager
        def idle(self):
            events.append("idle")
            yield
            events.append("busy")

    for interactive, want in ((True, ["idle", "read", "busy"]), (False, ["read"])):
        events.clear()
        ui = ChatUI(SimpleNamespace(llm=Llm()), interactive=interactive, markdown=False)
        monkeypatch.setattr(ui, "read_message", lambda: events.append("read") or "hello")
        assert ui._read_while_idle() == "hello"
        assert events == want
