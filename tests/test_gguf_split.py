"""Split GGUF models (llama-gguf-split's NAME-0000i-of-0000N.gguf): opened by their first part, every part
checked, and every command working on them as on the single file they were split from."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType

from llamacy import Llama
from llamacy.gguf import GGUFError, GGUFFile
from tests.conftest import default_sigint
from tests.split_factory import split_model, with_keys

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "hello world"
N_TENSORS = 21  # the tiny llama model: 3 + 9 per layer, 2 layers


def llamacy(*args: str, input: bytes | None = None, env: dict[str, str] | None = None):
    full = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("LLAMACY_DEBUG", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        full.pop(k, None)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "llamacy", *args], input=input, capture_output=True, timeout=120, env=full
    )


def one_line_error(r: subprocess.CompletedProcess, *fragments: str) -> None:
    err = r.stderr.decode()
    assert r.returncode != 0 and r.stdout == b"" and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("llamacy: error:"), err
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture(scope="module")
def m(tmp_path_factory) -> dict[str, list[Path]]:
    """The tiny model as one file and split several ways, plus another model's split."""
    from tests.model_factory import write_tiny_model

    d = tmp_path_factory.mktemp("split")
    single = write_tiny_model(d / "tiny.gguf", arch="llama", wtype=QT.Q8_0)
    other = write_tiny_model(d / "other.gguf", arch="llama", wtype=QT.Q8_0, n_layer=3, seed=1)
    splits = {"single": [single]}
    for name, src, max_tensors, empty_first in [
        ("three", single, 8, False),  # 8 + 8 + 5 tensors
        ("sevens", single, 7, False),  # 7 + 7 + 7
        ("two", single, 11, False),  # 11 + 10
        ("empty_first", single, 11, True),  # 0 + 11 + 10: llama-gguf-split --no-tensor-first-split
        ("other", other, 10, False),  # 30 tensors: 10 + 10 + 10
    ]:
        (d / name).mkdir()
        splits[name] = split_model(src, d / name / "tiny", max_tensors, empty_first=empty_first)
    return splits


def assemble(d: Path, parts: list[Path]) -> Path:
    """Copy `parts` into `d` as the parts of one split model, in this order; return the first part."""
    n = len(parts)
    for i, p in enumerate(parts):
        shutil.copyfile(p, d / f"tiny-{i + 1:05d}-of-{n:05d}.gguf")
    return d / f"tiny-00001-of-{n:05d}.gguf"


def refused(path: Path, *fragments: str) -> str:
    with pytest.raises(GGUFError) as e:
        GGUFFile(path)
    message = str(e.value)
    assert "\n" not in message
    for f in fragments:
        assert f in message, message
    return message


# --- loading -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["three", "empty_first"])
def test_logits_equal_the_single_file_bit_for_bit(m, split):
    single = Llama(m["single"][0], n_ctx=64, n_threads=1)
    parts = Llama(m[split][0], n_ctx=64, n_threads=1)
    ids = single.tokenizer.encode(PROMPT)
    np.testing.assert_array_equal(parts.logits(ids), single.logits(ids))
    greedy = {"max_tokens": 8, "temperature": 0}
    assert "".join(parts.generate(PROMPT, **greedy)) == "".join(single.generate(PROMPT, **greedy))


def test_one_tensor_table_over_all_parts(m):
    s, f = GGUFFile(m["single"][0]), GGUFFile(m["three"][0])
    assert [p.path for p in f.parts] == [str(p) for p in m["three"]]
    assert [p.n_tensors for p in f.parts] == [8, 8, 5]
    assert f.file_size == sum(p.stat().st_size for p in m["three"])
    assert f.path == str(m["three"][0]) and f.data_offset == f.parts[0].data_offset
    assert list(f.tensors) == list(s.tensors)
    for i, (name, t) in enumerate(f.tensors.items()):
        want = s.tensors[name]
        assert (t.type, t.shape, t.n_elements, t.n_bytes) == (
            want.type,
            want.shape,
            want.n_elements,
            want.n_bytes,
        )
        assert t.data.tobytes() == want.data.tobytes()
        assert t.part == min(i // 8, 2)
        part = f.parts[t.part]
        assert part.data_offset <= t.offset and t.offset + t.n_bytes <= part.file_size
    # The model's metadata is the first part's: the single file's, and the split keys.
    assert {k: v for k, v in f.metadata.items() if not k.startswith("split.")}.keys() == s.metadata.keys()
    for k, v in s.metadata.items():
        assert np.array_equal(f.metadata[k], v) if isinstance(v, np.ndarray) else f.metadata[k] == v, k
    assert (f.metadata["split.no"], f.metadata["split.count"], f.metadata["split.tensors.count"]) == (
        0,
        3,
        21,
    )
    view = f.tensors["output_norm.weight"].data
    f.close()
    assert f.tensors == {} and view.tobytes() == s.tensors["output_norm.weight"].data.tobytes()


def test_split_keys_on_one_file_mean_one_file(m, tmp_path):
    # A merged file keeps split.count 0 (llama-gguf-split --merge); a split into one part has 1.
    u16, i32 = GGUFValueType.UINT16, GGUFValueType.INT32
    for count in (0, 1):
        keys = {"split.no": (0, u16), "split.count": (count, u16), "split.tensors.count": (N_TENSORS, i32)}
        f = GGUFFile(with_keys(m["single"][0], tmp_path / f"merged-{count}.gguf", keys))
        assert len(f.parts) == 1 and len(f.tensors) == N_TENSORS


def test_model_identity_covers_every_part(m):
    from llamacy.model.memory_file import model_identity

    ids = {name: model_identity(GGUFFile(m[name][0])) for name in ("single", "three", "sevens", "two")}
    assert len(set(ids.values())) == 4
    assert model_identity(GGUFFile(m["three"][0])) == ids["three"]


def test_memory_file_round_trip(m, tmp_path):
    llm = Llama(m["three"][0], n_ctx=64, n_threads=1)
    "".join(llm.generate(PROMPT, max_tokens=4, temperature=0))
    llm.save_memory(tmp_path / "mem.bin")
    again = Llama(m["three"][0], n_ctx=64, n_threads=1)
    assert again.load_memory(tmp_path / "mem.bin").tokens
    from llamacy.model.memory_file import MemoryFileError

    with pytest.raises(MemoryFileError, match="another model"):
        Llama(m["sevens"][0], n_ctx=64, n_threads=1).load_memory(tmp_path / "mem.bin")


# --- refusals: one line, naming the file ----------------------------------------------------------------


def test_missing_part(m, tmp_path):
    first = assemble(tmp_path, m["three"])
    (tmp_path / "tiny-00002-of-00003.gguf").unlink()
    refused(first, "part 2 of 3 is missing", str(tmp_path / "tiny-00002-of-00003.gguf"))
    # A dangling link (a cache blob deleted by hand) is as missing.
    (tmp_path / "tiny-00002-of-00003.gguf").symlink_to(tmp_path / "gone")
    refused(first, "part 2 of 3 is missing")
    one_line_error(llamacy("run", PROMPT, "-m", str(first)), "part 2 of 3 is missing")


def test_a_later_part_names_the_first(m):
    for i in (1, 2):
        refused(
            m["three"][i], f"is part {i + 1} of a model split into 3 files", f"first part, {m['three'][0]}"
        )
    one_line_error(llamacy("info", str(m["three"][1])), "load it by its first part")


def test_first_part_renamed(m, tmp_path):
    shutil.copyfile(m["three"][0], tmp_path / "model.gguf")
    refused(tmp_path / "model.gguf", "does not end in -00001-of-00003.gguf", "cannot be found")


@pytest.mark.parametrize(
    ("parts", "fragments"),
    [
        # A part of the same model split into two: another split.count.
        ((("three", 0), ("two", 1), ("three", 2)), ("tiny-00002-of-00003.gguf", "split.count is 2", "is 3")),
        # Part 3 named as part 2.
        ((("three", 0), ("three", 2), ("three", 2)), ("split.no is 2 but its name makes it part 2",)),
        # Another model's part: it counts another number of tensors.
        (
            (("three", 0), ("three", 1), ("other", 2)),
            ("split.tensors.count is 30 but the first part's is 21",),
        ),
        # The same model split otherwise: part 3 holds tensors part 2 has too.
        (
            (("three", 0), ("three", 1), ("sevens", 2)),
            ("tiny-00003-of-00003.gguf: tensor 'blk.", "is also in"),
        ),
        # ... or no part holds tensor 8.
        ((("sevens", 0), ("three", 1), ("three", 2)), ("split.tensors.count is 21 but the 3 parts hold 20",)),
        # A plain file where a part should be.
        ((("three", 0), ("single", 0), ("three", 2)), ("tiny-00002-of-00003.gguf: split.count is missing",)),
    ],
)
def test_part_of_another_model(m, tmp_path, parts, fragments):
    first = assemble(tmp_path, [m[name][i] for name, i in parts])
    refused(first, *fragments)


@pytest.mark.parametrize("keep", [100, 0.5])
def test_truncated_part(m, tmp_path, keep):
    first = assemble(tmp_path, m["three"])
    last = tmp_path / "tiny-00003-of-00003.gguf"
    data = last.read_bytes()
    last.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    message = refused(first, str(last))
    assert "truncated" in message or "past the end" in message
    one_line_error(llamacy("run", PROMPT, "-m", str(first)), str(last))


def test_split_keys_of_the_wrong_type(m, tmp_path):
    keys = {"split.no": (0, GGUFValueType.UINT16), "split.count": ("3", GGUFValueType.STRING)}
    bad = with_keys(m["single"][0], tmp_path / "bad-00001-of-00003.gguf", keys)
    refused(bad, "split.count must be an integer from 0 to 65535, got '3'")


# --- every command ---------------------------------------------------------------------------------------


def test_info(m):
    r = llamacy("info", str(m["three"][0]))
    assert r.returncode == 0, r.stderr
    assert "split into 3 parts" in r.stdout.decode()
    single, split = (json.loads(llamacy("info", str(m[k][0]), "--json").stdout) for k in ("single", "three"))
    assert split["parts"] == [str(p) for p in m["three"]] and single["parts"] == [str(m["single"][0])]
    assert split["file_size"] == sum(p.stat().st_size for p in m["three"])
    for d in (single, split):
        del d["path"], d["parts"], d["file_size"]
    assert split == single


def test_run_and_chat_answer_as_the_single_file(m):
    args = (PROMPT, "-n", "8", "--temp", "0", "-t", "1")
    single, split = (llamacy("run", *args, "-m", str(m[k][0])) for k in ("single", "three"))
    assert split.returncode == 0 and split.stderr == b"", split.stderr
    assert split.stdout == single.stdout and split.stdout
    chat = ("chat", "--temp", "0", "-n", "6", "-t", "1")
    single, split = (llamacy(*chat, "-m", str(m[k][0]), input=b"hi there\n") for k in ("single", "three"))
    assert split.returncode == 0 and split.stderr == b"", split.stderr
    assert split.stdout == single.stdout and split.stdout


def test_bench(m, capsys):
    from llamacy.cli import main

    with pytest.raises(SystemExit) as done:
        main(["bench", "-m", str(m["three"][0]), "-p", "8", "-n", "2", "-t", "1", "-r", "1", "-o", "json"])
    assert done.value.code in (0, None)
    rows = json.loads(capsys.readouterr().out)  # prompt processing, then generation
    weights = sum(t.n_bytes for t in GGUFFile(m["single"][0]).tensors.values())
    assert [r["model_size"] for r in rows] == [weights, weights]


def test_convert_to_one_file(m, tmp_path):
    from llamacy.convert import convert

    convert(m["single"][0], tmp_path / "want.gguf", "q4_0", threads=1)
    r = llamacy("convert", str(m["three"][0]), "-o", str(tmp_path / "got.gguf"), "--type", "q4_0", "-t", "1")
    assert r.returncode == 0, r.stderr
    # The split keys are dropped: the same bytes as converting the single file.
    assert (tmp_path / "got.gguf").read_bytes() == (tmp_path / "want.gguf").read_bytes()
    assert not any(k.startswith("split.") for k in GGUFFile(tmp_path / "got.gguf").metadata)
    # Writing over one of the source's parts is refused before anything is written.
    second = m["three"][1]
    before = second.read_bytes()
    r = llamacy("convert", str(m["three"][0]), "-o", str(second), "--type", "q4_0", "-t", "1")
    assert r.returncode != 0 and b"part of the split source" in r.stderr and b"Traceback" not in r.stderr
    assert second.read_bytes() == before


def test_serve(m):
    want = "".join(Llama(m["single"][0], n_threads=1).generate(PROMPT, max_tokens=6, temperature=0))
    cmd = [
        sys.executable,
        "-m",
        "llamacy",
        "serve",
        "-m",
        str(m["three"][0]),
        "--port",
        "0",
        "-t",
        "1",
        "-c",
        "64",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint
    )
    try:
        line = proc.stderr.readline()
        assert "serving tiny [64 tokens] at http://127.0.0.1:" in line, line  # named without -00001-of-00003
        url = line.split(" at ")[1].split()[0].removesuffix("/v1")
        assert [d["id"] for d in httpx.get(url + "/v1/models").json()["data"]] == ["tiny"]
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"] == want
        (tag,) = httpx.get(url + "/api/tags").json()["models"]
        assert tag["size"] == sum(p.stat().st_size for p in m["three"])
        assert tag["digest"] == hashlib.sha256(b"".join(p.read_bytes() for p in m["three"])).hexdigest()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- pulled from a hub ---------------------------------------------------------------------------------------


def _cache_with_split(hf_home: Path, parts: list[Path]) -> Path:
    """huggingface_hub's cache layout for a pulled split model: blobs named by hash, the snapshot's files
    links to them (so the parts are found by name beside the first, not beside its blob)."""
    repo = hf_home / "hub" / "models--tester--split-GGUF"
    snap = repo / "snapshots" / ("c" * 40) / "Q8_0"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    for i, p in enumerate(parts):
        data = p.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f"tiny-Q8_0-{i + 1:05d}-of-{len(parts):05d}.gguf").symlink_to(os.path.relpath(blob, snap))
    return snap


def test_pulled_split_model_runs_from_its_first_part(m, tmp_path):
    from llamacy import hub
    from llamacy.hub.names import HubRef

    snap = _cache_with_split(tmp_path / "hf", m["three"])
    pulled = hub.find_pulled(HubRef("tester/split-GGUF", "Q8_0"), cache=tmp_path / "hf" / "hub")
    assert pulled is not None and pulled.variant.split
    assert hub.model_path(pulled) == snap / "tiny-Q8_0-00001-of-00003.gguf"
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}  # from the cache: no network
    args = (PROMPT, "-n", "8", "--temp", "0", "-t", "1")
    got = llamacy("run", *args, "-m", "tester/split-GGUF:Q8_0", env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout == llamacy("run", *args, "-m", str(m["single"][0])).stdout
    rows = {r["name"]: r for r in json.loads(llamacy("list", "--json", env=env).stdout)}
    assert rows["tester/split-GGUF:Q8_0"]["architecture"] == "llama"  # read from the first part
