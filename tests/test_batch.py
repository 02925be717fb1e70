"""`llamacy batch`: results per item, bad items isolated, resumable after a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from llamacy import Llama
from llamacy.batch import done_ids, read_items, run_batch
from llamacy.errors import LlamacyError, UsageError

ROOT = Path(__file__).resolve().parent.parent


def _batch_cmd(*args: str) -> list[str]:
    """`llamacy batch ARGS` as a subprocess command line."""
    return [sys.executable, "-m", "llamacy", "batch", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    from tests.model_factory import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("batch") / "tiny.gguf", arch="llama", wtype=QT.Q8_0)


@pytest.fixture(scope="module")
def llm(model_path) -> Llama:
    return Llama(model_path, n_threads=1, n_ctx=64)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_text_file_results_match_solo_generation(llm, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n\nthe cat\nsat on the mat\n")
    out = tmp_path / "r.jsonl"
    s = run_batch(llm, read_items(prompts), out, {"temperature": 0.0, "max_tokens": 6}, n_parallel=3)
    rows = {r["id"]: r for r in _lines(out)}
    assert set(rows) == {1, 3, 4}  # line numbers; the blank line is skipped
    for r in rows.values():
        solo = "".join(llm.generate(r["prompt"], max_tokens=6, temperature=0))
        assert r["completion"] == solo
        assert r["finish_reason"] in ("stop", "length")
        assert r["completion_tokens"] <= 6 and r["prompt_tokens"] > 0
        assert set(r["timings"]) >= {"prompt_ms", "predict_ms", "total_ms"}
    # The three prompts shared steps: fewer model steps than tokens generated.
    assert s.done == 3 and s.errors == 0
    assert s.steps < s.tokens + 3


def test_jsonl_items_with_own_options_and_a_bad_one(llm, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            [
                json.dumps({"id": "a", "prompt": "hello", "max_tokens": 3, "temperature": 0}),
                json.dumps({"id": "b", "prompt": "hello", "temperature": float("nan")}),
                "{not json",
                json.dumps({"id": "c", "prompt": "the cat", "seed": 5, "temperature": 1.0, "max_tokens": 4}),
                json.dumps({"id": "d", "prompt": 42}),
                json.dumps({"id": "e", "prompt": "x", "colour": "blue"}),
            ]
        )
    )
    out = tmp_path / "r.jsonl"
    s = run_batch(llm, read_items(prompts), out, {"max_tokens": 8}, n_parallel=2)
    rows = {r["id"]: r for r in _lines(out)}
    assert rows["a"]["completion_tokens"] <= 3
    assert "error" in rows["b"] and "temperature" in rows["b"]["error"]
    assert "error" in rows["line-3"] and "JSON" in rows["line-3"]["error"]
    assert rows["c"]["seed"] == 5 and rows["c"]["completion_tokens"] <= 4
    assert "error" in rows["d"] and "error" in rows["e"]
    assert (s.done, s.errors) == (2, 4)
    # Seeded sampling is reproducible through the batch.
    again = "".join(llm.generate("the cat", max_tokens=4, temperature=1.0, seed=5))
    assert rows["c"]["completion"] == again


def test_resume_skips_done_ids_and_repairs_a_torn_line(llm, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"prompt number {i}\n" for i in range(6)))
    out = tmp_path / "r.jsonl"
    run_batch(llm, read_items(prompts), out, {"temperature": 0.0, "max_tokens": 3})
    lines = out.read_text().splitlines(keepends=True)
    # Keep two whole results and half of a third, as a crash mid-write would leave.
    out.write_text(lines[0] + lines[1] + lines[2][: len(lines[2]) // 2])
    kept = {json.loads(lines[0])["id"], json.loads(lines[1])["id"]}
    s = run_batch(llm, read_items(prompts), out, {"temperature": 0.0, "max_tokens": 3})
    rows = _lines(out)  # every line parses: the torn one was cut
    assert sorted(r["id"] for r in rows) == [1, 2, 3, 4, 5, 6]
    assert s.skipped == 2 and s.done == 4
    assert {r["id"] for r in rows[:2]} == kept


def test_duplicate_ids_rejected_before_work(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n')
    with pytest.raises(UsageError, match="more than once"):
        read_items(prompts)


def test_garbage_in_the_middle_of_results_is_not_appended_to(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"id": 1}\nnot json\n{"id": 2}\n')
    with pytest.raises(LlamacyError, match="line 2"):
        done_ids(out)


@pytest.mark.slow
def test_kill_9_mid_batch_then_resume(model_path, tmp_path):
    """A hard crash loses at most the items in flight; the rerun completes every id exactly once."""
    prompts = tmp_path / "p.txt"
    # Many items: the tiny model finishes one in about a millisecond on a quiet machine, and 40 of them
    # could all be written between two polls, leaving no batch to crash in the middle of.
    n_items = 400
    prompts.write_text("".join(f"item {i} says hello\n" for i in range(n_items)))
    out = tmp_path / "r.jsonl"
    env = _env()
    cmd = _batch_cmd(
        str(prompts), "-o", str(out), "-m", str(model_path), "-n", "40", "--temp", "0", "-t", "1",
        "--parallel", "2", "-c", "64",
    )  # fmt: skip
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 3):
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    before = _lines(out)
    assert 3 <= len(before) < n_items, "the crash should land mid-batch"
    r = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    after = _lines(out)
    assert sorted(x["id"] for x in after) == list(range(1, n_items + 1))
    assert after[: len(before)] == before  # earlier lines untouched


def test_cli_in_a_pipe_is_silent(model_path, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a\nb\n")
    r = subprocess.run(
        _batch_cmd(
            str(prompts), "-o", str(tmp_path / "r.jsonl"), "-m", str(model_path), "-n", "2", "-t", "1"
        ),
        capture_output=True,
        env=_env(),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"" and r.stderr == b""
    assert len(_lines(tmp_path / "r.jsonl")) == 2


@pytest.mark.model
def test_chat_mode_on_the_default_model(default_model_path, tmp_path):
    prompts = tmp_path / "q.txt"
    prompts.write_text("Name the capital of France.\nName the capital of Germany.\n")
    out = tmp_path / "r.jsonl"
    r = subprocess.run(
        _batch_cmd(str(prompts), "-o", str(out), "--chat", "--temp", "0", "-n", "24", "-t", "1"),
        capture_output=True,
        env=_env(),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    rows = {x["id"]: x for x in _lines(out)}
    assert "Paris" in rows[1]["completion"] and "Berlin" in rows[2]["completion"]
    assert rows[1]["finish_reason"] == "stop"  # ended at <|im_end|>, which is never part of the text
    assert "<|im_end|>" not in rows[1]["completion"]
