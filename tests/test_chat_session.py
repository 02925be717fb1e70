"""`llamacy chat --session FILE`: a conversation and its memory survive a restart; the resumed process
evaluates only the new turn and replies as the uninterrupted conversation would."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.chat import ChatSession
from tests.test_chat import llamacy, run_turn
from tests.test_cli import assert_one_line_error


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    from tests.model_factory import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("chats") / "tiny.gguf", arch="llama", wtype=QT.Q8_0)


def test_a_restarted_session_evaluates_only_the_new_turn(tiny_path, tmp_path):
    from llamacy import Llama

    f = tmp_path / "chat.session"
    s = ChatSession(Llama(tiny_path, n_threads=1), system="Be brief.", max_tokens=6, temperature=0)
    t1 = run_turn(s, "hello there")
    s.save_session(f)
    want = run_turn(s, "and then")  # the conversation, uninterrupted
    assert want.stats.prompt_evaluated < len(want.ids) // 2

    again = ChatSession(Llama(tiny_path, n_threads=1), max_tokens=6, temperature=0)  # a new process's
    again.load_session(f)
    assert again.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": t1.text},
    ]
    got = run_turn(again, "and then")
    assert got.ids == want.ids and got.text == want.text
    assert got.stats.prompt_evaluated == want.stats.prompt_evaluated


def test_chat_session_flag_resumes_after_a_restart(tiny_path, tmp_path):
    f = tmp_path / "c.session"
    args = ("-m", str(tiny_path), "--temp", "0", "-n", "6", "-t", "1")
    whole = llamacy(*args, input=b"hello there\nand then\n")
    assert whole.returncode == 0, whole.stderr
    first = llamacy(*args, "--session", str(f), input=b"hello there\n")
    assert first.returncode == 0 and f.exists(), first.stderr
    second = llamacy(*args, "--session", str(f), input=b"and then\n")
    assert second.returncode == 0, second.stderr
    assert "resumed 2 messages" in second.stderr.decode()
    assert first.stdout.decode() + "\n" + second.stdout.decode() == whole.stdout.decode()


def test_a_session_of_another_model_is_refused(tiny_path, tmp_path):
    from tests.model_factory import write_tiny_model

    f = tmp_path / "c.session"
    assert (
        llamacy("-m", str(tiny_path), "-n", "2", "-t", "1", "--session", str(f), input=b"hi\n").returncode
        == 0
    )
    other = write_tiny_model(tmp_path / "other.gguf", arch="llama", wtype=QT.Q8_0, n_layer=3)
    r = llamacy("-m", str(other), "-n", "2", "-t", "1", "--session", str(f), input=b"hi\n")
    assert_one_line_error(r, 1, "saved from another model")
