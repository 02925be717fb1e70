"""The command line as a user in a shell meets it: output discipline, exit codes, one-line errors."""

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

from tests.conftest import default_sigint

ROOT = Path(__file__).resolve().parent.parent


def llamacy(*args: str, input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LLAMACY_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "llamacy", *args], input=input, capture_output=True, timeout=timeout, env=env
    )


def assert_one_line_error(r: subprocess.CompletedProcess, code: int, fragment: str) -> None:
    err = r.stderr.decode()
    assert r.returncode == code, err
    assert r.stdout == b""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("llamacy: error:")
    assert fragment in lines[0]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    from tests.model_factory import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("cli") / "tiny.gguf", arch="llama", wtype=QT.Q8_0)


def test_pipe_gets_only_the_completion(tiny_path):
    r = llamacy("run", "hello world", "-m", str(tiny_path), "-n", "8", "--temp", "0", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    from llamacy import Llama

    want = "".join(Llama(tiny_path, n_threads=1).generate("hello world", max_tokens=8, temperature=0))
    assert r.stdout.decode() == want


@pytest.mark.slow
def test_stdin_and_file_prompts_match_argument(tiny_path, tmp_path):
    base = ("-m", str(tiny_path), "-n", "6", "--temp", "0", "-t", "1")
    arg = llamacy("run", "hello world", *base).stdout
    assert llamacy("run", "-", *base, input=b"hello world\n").stdout == arg
    f = tmp_path / "prompt.txt"
    f.write_text("hello world\n")
    assert llamacy("run", "-f", str(f), *base).stdout == arg


def test_echo_prints_prompt_first(tiny_path):
    r = llamacy("run", "hello", "-m", str(tiny_path), "-n", "3", "--temp", "0", "--echo")
    assert r.stdout.decode().startswith("hello")


def test_verbose_stats_go_to_stderr(tiny_path):
    r = llamacy("run", "hello", "-m", str(tiny_path), "-n", "3", "--temp", "0", "--verbose")
    assert r.returncode == 0
    assert "tok/s" in r.stderr.decode()
    assert "tok/s" not in r.stdout.decode()


def test_invalid_utf8_on_stdin_is_replaced_not_fatal(tiny_path):
    r = llamacy("run", "-", "-m", str(tiny_path), "-n", "2", "--temp", "0", input=b"caf\xe9 \xff\xfe ok")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "args,code,fragment",
    [
        (("-n", "-5"), 2, "--predict"),
        (("--temp", "nan"), 2, "temperature"),
        (("-t", "0"), 2, "--threads"),
        (("-c", str(10**9)), 2, "--ctx-size"),
        (("--top-p", "1.5"), 2, "top_p"),
    ],
)
@pytest.mark.slow
def test_bad_options_fail_before_work(tiny_path, args, code, fragment):
    assert_one_line_error(llamacy("run", "hi", "-m", str(tiny_path), *args), code, fragment)


def test_missing_model(tmp_path):
    assert_one_line_error(llamacy("run", "hi", "-m", str(tmp_path / "nope.gguf")), 2, "no such model file")


def test_truncated_model(tiny_path, tmp_path):
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(tiny_path.read_bytes()[:3000])
    assert_one_line_error(llamacy("run", "hi", "-m", str(bad)), 1, "truncated.gguf")


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("just some text, not a model\n")
    assert_one_line_error(llamacy("run", "hi", "-m", str(bad)), 1, "notes.gguf")


def test_unsupported_architecture(tmp_path):
    import gguf

    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_one_line_error(llamacy("run", "hi", "-m", str(path)), 1, "architecture 'mamba' is not supported")


def test_prompt_longer_than_context(tiny_path):
    r = llamacy("run", "hello " * 50, "-m", str(tiny_path), "-c", "16")
    assert_one_line_error(r, 2, "context holds 16")


@pytest.mark.slow
def test_info_json(tiny_path):
    r = llamacy("info", str(tiny_path), "--json", "-c", "32")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["architecture"] == "llama"
    assert d["ctx_size"] == 32
    assert d["kv_type"] == "f16"
    assert d["memory"]["kv_cache"] == 2 * 2 * 32 * 2 * 16 * 2  # K+V, layers, ctx, kv heads, head_dim, f16
    r = llamacy("info", str(tiny_path), "--json", "-c", "32", "--kv-type", "f32")
    assert json.loads(r.stdout)["memory"]["kv_cache"] == 2 * 2 * 32 * 2 * 16 * 4
    r = llamacy("info", str(tiny_path), "--kv-type", "q4")
    assert_one_line_error(r, 2, "--kv-type must be one of f16, f32")
    assert d["quant_mix"]["Q8_0"] > 0
    # -m as every other command takes it; the same answer as the positional form.
    r = llamacy("info", "-m", str(tiny_path), "--json", "-c", "32")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == d
    assert_one_line_error(llamacy("info", "x.gguf", "-m", str(tiny_path)), 2, "two models given")


@pytest.mark.slow
def test_ctrl_c_stops_cleanly(tmp_path):
    from tests.model_factory import write_tiny_model

    # A prompt of 40k tokens takes minutes to evaluate (attention is quadratic): Ctrl-C must cut it short.
    path = write_tiny_model(tmp_path / "long.gguf", arch="llama", wtype=QT.Q8_0, n_ctx=65536)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("a b " * 20000)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llamacy",
            "run",
            "-f",
            str(prompt),
            "-m",
            str(path),
            "-c",
            "65536",
            "-t",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=default_sigint,  # interrupted below, whatever runs this test
    )
    time.sleep(4)
    assert p.poll() is None, p.stderr.read()
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert time.monotonic() - t0 < 10
    assert p.returncode == 130, err
    assert b"Traceback" not in err
    assert out == b""


@pytest.mark.model
def test_default_model_run_in_pipe():
    r = llamacy("run", "The capital of France is", "-n", "4", "--temp", "0")
    if r.returncode == 2 and b"not installed" in r.stderr:
        pytest.skip("default model not installed")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().startswith(" Paris.")
