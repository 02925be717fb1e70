"""`llamacy serve --ray` and `llamacy batch --ray` on a private Ray cluster (tests/ray_cluster.py): one node
on 127.0.0.1, 2 CPUs, its own ports, temp dir and token, stopped at the end whatever happens. Every test
here shares it, in file order: the server tests with 2 replicas x 1 thread, then its removal on SIGTERM
(which frees the CPUs), then the batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve", reason="the ray extra is not installed (pip install 'llamacy[ray]')")

from llamacy.server import ServerSettings, ServerThread, create_app
from llamacy.server.loading import ModelLoader
from llamacy.server.models import ModelSpec
from tests.conftest import default_sigint
from tests.ray_cluster import LocalRayCluster, free_ports

# A local Ray cluster and Serve deployments: a minute and more, so not in `make test-fast`.
pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
CTX = 512
START_TIMEOUT = 180.0  # deploying loads the model in each replica; the machine may be busy
RECOVERY_TIMEOUT = 60.0  # after kill -9 of a replica, requests must succeed again within this


def _llamacy(*args: str) -> list[str]:
    return [sys.executable, "-m", "llamacy", *args]


@pytest.fixture(scope="module")
def cluster(default_model_path):
    c = LocalRayCluster(num_cpus=2)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def served(cluster):
    """`llamacy serve --ray` with 2 replicas x 1 thread: (url, process)."""
    (port,) = free_ports(1)
    log = open(cluster.tmp / "serve.log", "wb")  # noqa: SIM115
    cmd = _llamacy(
        "serve", "--ray", cluster.address, "--replicas", "2", "-t", "1", "--port", str(port), "-c", str(CTX)
    )
    proc = subprocess.Popen(cmd, env=cluster.env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    "serve --ray did not come up:\n" + (cluster.tmp / "serve.log").read_text()
                )
            time.sleep(0.5)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


@pytest.fixture(scope="module")
def local():
    """A local server with the same model and settings as each replica (4 parallel, 1 thread)."""
    served = ModelLoader(n_ctx=CTX, n_threads=1, n_parallel=4)(ModelSpec(MODEL, MODEL))
    app = create_app(served.scheduler, served.template, ServerSettings(model_name=MODEL))
    try:
        with ServerThread(app) as srv:
            yield srv.url
    finally:
        served.scheduler.shutdown()


def _ask(url: str, case: tuple[str, str]) -> tuple[str, str]:
    """(the answer's text, the replica named in the response)."""
    kind, text = case
    if kind == "completion":
        body = {"model": MODEL, "prompt": text, "max_tokens": 12, "temperature": 0}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        return r.json()["choices"][0]["text"], r.headers.get("x-llamacy-replica", "")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 12,
        "temperature": 0,
    }
    if kind == "chat":
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"], r.headers.get("x-llamacy-replica", "")
    pieces = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    pieces.append(choice["delta"].get("content") or "")
        return "".join(pieces), r.headers.get("x-llamacy-replica", "")


CASES = [
    ("completion", "The capital of France is"),
    ("completion", "Once upon a time, in a small village,"),
    ("completion", "The three primary colors are"),
    ("completion", "def fibonacci(n):"),
    ("chat", "Name a large animal."),
    ("chat", "What is two plus two?"),
    ("stream", "Say hello to the reader."),
    ("stream", "Which planet is the largest?"),
]


def test_concurrent_greedy_requests_equal_a_local_server_and_both_replicas_serve(served, local):
    url, _ = served
    with ThreadPoolExecutor(8) as pool:
        remote = list(pool.map(lambda c: _ask(url, c), CASES))
        expected = list(pool.map(lambda c: _ask(local, c)[0], CASES))
    assert [text for text, _ in remote] == expected
    names = {name for _, name in remote}
    assert "" not in names
    assert len(names) == 2, f"8 concurrent requests went to {names}"


def test_every_response_names_its_replica(served):
    url, _ = served
    for method, path, body in [
        ("GET", "/health", None),
        ("GET", "/metrics", None),
        ("GET", "/v1/models", None),
        ("GET", "/no/such/path", None),
        ("POST", "/v1/completions", b"{not json"),
    ]:
        r = httpx.request(method, f"{url}{path}", content=body, timeout=60)
        assert r.headers.get("x-llamacy-replica"), (path, r.status_code)
    assert httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"] == MODEL


def test_a_conversation_stays_on_its_replica(served):
    url, _ = served
    messages = [
        {"role": "system", "content": "You are a patient teacher who answers in one short sentence. " * 3},
        {"role": "user", "content": "What is the sun?"},
    ]
    seen = []
    for turn in range(3):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0},
            timeout=120,
        )
        r.raise_for_status()
        seen.append(r.headers["x-llamacy-replica"])
        if turn:
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"And number {turn}?"}]
    assert len(set(seen)) == 1, seen


def test_the_job_api_works_through_the_ingress(served):
    url, _ = served
    r = httpx.post(
        f"{url}/jobs", json={"id": "ray-job-1", "prompt": "The sky is", "max_tokens": 8}, timeout=60
    )
    assert r.status_code == 202 and r.json()["id"] == "ray-job-1"
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/jobs/status/ray-job-1", timeout=30).json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    answers, readers = [], set()
    for _ in range(16):  # unrouted GETs: both replicas answer some of them
        r = httpx.get(f"{url}/jobs/ray-job-1", timeout=30)
        assert r.status_code == 200
        answers.append(r.json())
        readers.add(r.headers["x-llamacy-replica"])
    assert len(readers) == 2
    assert all(a == answers[0] for a in answers)
    job = answers[0]
    assert job["status"] == "done" and job["response"] and job["stats"]["total_time_ms"] >= 0
    for _ in range(4):  # the id is taken for every replica
        again = httpx.post(f"{url}/jobs", json={"id": "ray-job-1", "prompt": "x"}, timeout=30)
        assert again.status_code == 409
    assert httpx.get(f"{url}/jobs/no-such-job", timeout=30).status_code == 404


def test_a_killed_replica_is_replaced_and_its_job_ends(served):
    url, _ = served
    body = {"id": "doomed", "prompt": "Count:", "max_tokens": 400, "ignore_eos": True, "temperature": 0}
    r = httpx.post(f"{url}/jobs", json=body, timeout=60)
    assert r.status_code == 202
    victim = r.headers["x-llamacy-replica"]
    os.kill(int(victim.rsplit("/", 1)[1]), signal.SIGKILL)
    t0 = time.monotonic()

    # New requests succeed again within a bounded time (the ingress tries another replica).
    while True:
        try:
            ok = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
            if ok.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < RECOVERY_TIMEOUT, "no answer after the replica was killed"
        time.sleep(0.2)
    assert ok.headers["x-llamacy-replica"] != victim

    # Its job does not stay running: it ends as an error, saying why.
    while (job := httpx.get(f"{url}/jobs/doomed", timeout=30).json())["status"] in ("pending", "running"):
        assert time.monotonic() - t0 < RECOVERY_TIMEOUT, "the dead replica's job is still running"
        time.sleep(0.3)
    assert job["status"] == "error" and victim in job["error"]

    # Ray starts a replacement, and it serves.
    names = set()
    while len(names - {victim}) < 2:
        assert time.monotonic() - t0 < START_TIMEOUT, f"no replacement replica; seen {names}"
        r = httpx.get(f"{url}/health", timeout=30)
        names.add(r.headers.get("x-llamacy-replica", ""))
        time.sleep(0.2)


def test_nothing_listens_or_connects_outside_loopback(served, cluster):
    assert cluster.pids(), "the cluster's processes were not found"
    assert cluster.foreign_sockets() == []


def test_sigterm_removes_the_deployment(served):
    url, proc = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=5)


# ---- batch ----------------------------------------------------------------------------------------------


def _batch(prompts: Path, out: Path, *extra: str) -> list[str]:
    return _llamacy(
        "batch", str(prompts), "-o", str(out), "-n", "24", "--temp", "0", "-s", "5",
        "--parallel", "2", "-t", "1", "-c", "256", *extra,
    )  # fmt: skip


def _results(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_id = {r["id"]: {k: v for k, v in r.items() if k != "timings"} for r in rows}
    assert len(by_id) == len(rows), "an id appears twice"
    return by_id


def test_batch_on_ray_equals_the_local_batch_and_resumes(cluster, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"Item {i}: a sentence about the number {i}.\n" for i in range(1, 25)))
    local, remote = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    subprocess.run(_batch(prompts, local), env=cluster.env, check=True, timeout=300)
    cmd = _batch(prompts, remote, "--ray", cluster.address, "--replicas", "2")
    p = subprocess.Popen(cmd, env=cluster.env, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    deadline = time.monotonic() + 180
    while not remote.exists() or remote.read_text().count("\n") < 2:
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.stderr else ""
        time.sleep(0.05)
    assert cluster.foreign_sockets() == []  # the driver and the Ray Data workers, mid-run
    p.send_signal(signal.SIGINT)
    p.wait(60)
    before = remote.read_text().splitlines()
    assert 2 <= len(before) < 24, "the interrupt should land mid-batch"
    r = subprocess.run(cmd, env=cluster.env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert remote.read_text().splitlines()[: len(before)] == before  # earlier lines untouched
    assert _results(remote) == _results(local)


def test_without_ray_the_flag_says_how_to_get_it(tmp_path):
    (tmp_path / "p.txt").write_text("a\n")
    block = (
        "import sys; sys.modules['ray'] = None; from llamacy.cli import main; sys.argv[0] = 'llamacy'; main()"
    )
    for args in (
        ["serve", "--ray", "127.0.0.1:1"],
        ["batch", str(tmp_path / "p.txt"), "-o", "x", "--ray", "a"],
    ):
        r = subprocess.run([sys.executable, "-c", block, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert r.stderr.count("\n") == 1 and "pip install 'llamacy[ray]'" in r.stderr, r.stderr
