"""llama-server's slot endpoints: save a slot's memory, restart the server, restore it, and the continued
request evaluates only its new tokens with the same answer; names that could leave --slot-save-path and
files that do not fit are refused with a 400."""

from __future__ import annotations

import os
import struct

import httpx
import pytest

from tests.test_server import running_server

PROMPT = "The quick brown fox jumps. " * 2


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from llamacy import Llama
    from tests.model_factory import write_tiny_model

    return Llama(write_tiny_model(tmp_path_factory.mktemp("slots") / "tiny.gguf"), n_ctx=128, n_threads=1)


def _complete(c: httpx.Client, prompt: str, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, **extra}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_save_restart_restore_continues_with_only_the_new_tokens(llm, tmp_path):
    more = PROMPT + "And then"
    with (
        running_server(llm, parallel=2, slot_save_path=str(tmp_path)) as (srv, _),
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        first = _complete(c, PROMPT, id_slot=1)
        saved = c.post("/slots/1?action=save", json={"filename": "conv.bin"})
        assert saved.status_code == 200, saved.text
        s = saved.json()
        assert s["id_slot"] == 1 and s["filename"] == "conv.bin" and s["n_saved"] > 0
        assert s["n_written"] == (tmp_path / "conv.bin").stat().st_size and "save_ms" in s["timings"]
        want = _complete(c, more, id_slot=1)  # continued in the same server
        slots = c.get("/slots").json()
        assert [x["id"] for x in slots] == [0, 1] and slots[1]["n_tokens"] > 0
    n_prompt = first["usage"]["prompt_tokens"]
    with (
        running_server(llm, parallel=2, slot_save_path=str(tmp_path)) as (srv, _),
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        r = c.post("/slots/0?action=restore", json={"filename": "conv.bin"})
        assert r.status_code == 200, r.text
        assert r.json()["n_restored"] == s["n_saved"] and r.json()["n_read"] == s["n_written"]
        got = _complete(c, more, id_slot=0)
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == want["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_prompt - 1
        erased = c.post("/slots/0?action=erase").json()
        assert erased["id_slot"] == 0 and erased["n_erased"] > n_prompt
        assert c.get("/slots").json()[0]["n_tokens"] == 0


def test_slot_names_cannot_leave_the_directory(llm, tmp_path):
    root = tmp_path / "slots"
    root.mkdir()
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"x")
    os.symlink(outside, root / "link.bin")
    with (
        running_server(llm, parallel=1, slot_save_path=str(root)) as (srv, _),
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        _complete(c, "hello")
        for name in [
            "../secret.bin",
            "/etc/passwd",
            str(outside),
            "a/b",
            "..",
            ".hidden",
            "",
            " x",
            "link.bin",
            5,
        ]:
            for action in ("save", "restore"):
                r = c.post(f"/slots/0?action={action}", json={"filename": name})
                assert r.status_code == 400, (name, action, r.text)
                assert "\n" not in r.json()["error"]["message"]
        assert outside.read_bytes() == b"x"
        assert sorted(p.name for p in root.iterdir()) == ["link.bin"]
        (root / "junk.bin").write_bytes(b"LLMCYMEM" + struct.pack("<II", 1, 2) + b"{}" + b"\0" * 64)
        r = c.post("/slots/0?action=restore", json={"filename": "junk.bin"})
        assert r.status_code == 400 and "checksum" in r.json()["error"]["message"]
        assert str(root) not in r.json()["error"]["message"]  # the server's paths stay its own
        assert c.post("/slots/5?action=save", json={"filename": "a.bin"}).status_code == 400
        assert c.post("/v1/completions", json={"prompt": "hi", "id_slot": 3}).status_code == 400
    with running_server(llm, parallel=1) as (srv, _), httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.post("/slots/0?action=save", json={"filename": "a.bin"}).status_code == 501


def test_serve_refuses_a_slot_save_path_that_is_not_a_directory(tmp_path):
    from tests.test_cli import assert_one_line_error, llamacy

    r = llamacy("serve", "--slot-save-path", str(tmp_path / "nowhere"), "--port", "0")
    assert_one_line_error(r, 2, "is not a directory")
