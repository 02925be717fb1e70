"""The parts of `serve --ray` that need no cluster: prompt prefixes and the affinity memory, the tunnel that
runs the llamacy app on a forwarded request, the job store's shared hook, and the test cluster's socket
check (tests/test_ray.py runs the whole on a private cluster)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from llamacy.distributed.affinity import BLOCK_CHARS, PrefixMemory, prefix_hashes, prompt_text
from llamacy.distributed.tunnel import ForwardedRequest, portable_scope, run_app
from llamacy.server import ServerSettings, ServerThread, create_app
from llamacy.server.errors import APIError
from llamacy.server.job_store import JobStore
from tests.ray_cluster import _addr, _loopback_only

# ---- affinity -----------------------------------------------------------------------------------------


def _chat(*contents: str) -> bytes:
    roles = ["system", "user", "assistant", "user", "assistant"]
    return json.dumps(
        {"messages": [{"role": r, "content": c} for r, c in zip(roles, contents, strict=False)]}
    ).encode()


def test_a_conversation_next_turn_extends_its_prefixes():
    system = "You answer questions about astronomy in two sentences or fewer. " * 2
    turn1 = prefix_hashes(prompt_text(_chat(system, "What is a star?")))
    turn2 = prefix_hashes(prompt_text(_chat(system, "What is a star?", "A ball of gas.", "And a planet?")))
    question = "Why is the sky blue in the day, red at sunset, and black at night on the Moon?"
    other = prefix_hashes(prompt_text(_chat(system, question)))
    assert len(turn1) >= 2 and turn2[: len(turn1)] == turn1
    # Another conversation with the same system prompt shares the blocks the system prompt fills.
    shared = len(system) // BLOCK_CHARS
    assert other[:shared] == turn1[:shared] and other[-1] not in turn1


def test_prompt_text_of_each_kind_of_request():
    assert prompt_text(b'{"prompt": "abc", "model": "m"}') == "m\x1eabc"
    assert prompt_text(b'{"prompt": ["first", "second"]}').endswith("first")
    assert prompt_text(b'{"prompt": [1, 2, 3]}').endswith("[1, 2, 3]")
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert prompt_text(json.dumps(parts).encode()).endswith("user\x1fhi")
    for body in (b"", b"{not json", b"[1]", b'{"model": "m"}'):
        assert prompt_text(body) is None
    assert prefix_hashes(None) == () and len(prefix_hashes("short")) == 1
    assert len(prefix_hashes("x" * 100_000)) == 64  # bounded


def test_prefix_memory_prefers_the_longest_live_match_and_forgets():
    memory = PrefixMemory(capacity=4)
    memory.remember(("a", "b"), "r1")
    memory.remember(("a", "b", "c"), "r2")
    assert memory.best(("a", "b", "c", "d"), {"r1", "r2"}) == "r2"
    assert memory.best(("a", "b", "c"), {"r1"}) is None  # a and b were taken over by r2
    memory.forget_replica("r2")
    assert memory.best(("a", "b", "c"), {"r1", "r2"}) is None
    memory.remember(("w", "x", "y", "z", "v"), "r3")
    assert memory.best(("w",), {"r3"}) is None  # the least recently used went first
    assert memory.best(("w", "x", "y", "z", "v"), {"r3"}) == "r3"


# ---- replica plans --------------------------------------------------------------------------------------


def test_replica_plans_and_their_serve_options():
    from llamacy.distributed.ray_serve import ReplicaPlan, model_options
    from llamacy.errors import UsageError

    fixed = ReplicaPlan.parse("3", threads=2, min_replicas=None, max_replicas=None)
    assert (fixed.replicas, fixed.threads) == (3, 2) and fixed.describe() == "3 replicas x 2 threads"
    opts = model_options(fixed, parallel=4)
    assert opts["num_replicas"] == 3 and opts["ray_actor_options"] == {"num_cpus": 2}
    assert opts["max_ongoing_requests"] == 8 and "autoscaling_config" not in opts
    assert opts["request_router_config"].request_router_kwargs == {"imbalance": 4}

    auto = ReplicaPlan.parse("auto", threads=1, min_replicas=1, max_replicas=4)
    scaling = model_options(auto, parallel=4)["autoscaling_config"]
    assert (scaling.min_replicas, scaling.max_replicas, scaling.target_ongoing_requests) == (1, 4, 4)
    assert ReplicaPlan.parse("auto", 1, None, None).max_replicas == 2
    for text, lo, hi in (("0", None, None), ("two", None, None), ("2", 1, None), ("auto", 3, 2)):
        with pytest.raises(UsageError):
            ReplicaPlan.parse(text, 1, lo, hi)


# ---- the tunnel -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_app(tmp_path_factory):
    from llamacy import Llama
    from llamacy.chat_template import ChatTemplate
    from llamacy.scheduler import Scheduler
    from tests.model_factory import write_tiny_model

    llm = Llama(write_tiny_model(tmp_path_factory.mktemp("parts") / "tiny.gguf"), n_ctx=128, n_threads=1)
    sched = Scheduler(llm, n_parallel=2, n_ctx=128, n_threads=1).start()
    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    app = create_app(sched, tpl, ServerSettings(model_name="tiny", replica_name="r-test"))
    try:
        yield app
    finally:
        sched.shutdown()


def _forward(app: Any, path: str, body: dict) -> tuple[int, dict[bytes, bytes], bytes, int]:
    """(status, headers, body, number of batches) of a request run through the tunnel."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "app": object(),  # the ASGI server's own keys are dropped
    }
    request = ForwardedRequest(portable_scope(scope), json.dumps(body).encode())
    assert "app" not in request.scope

    async def collect() -> list[list[dict]]:
        return [batch async for batch in run_app(app, request)]

    batches = asyncio.run(collect())
    messages = [m for b in batches for m in b]
    start = messages[0]
    assert start["type"] == "http.response.start"
    payload = b"".join(m.get("body", b"") for m in messages[1:])
    return start["status"], dict(start["headers"]), payload, len(batches)


def test_the_tunnel_answers_as_the_app_does(tiny_app):
    body = {"prompt": "hello", "max_tokens": 6, "temperature": 0}
    status, headers, payload, _ = _forward(tiny_app, "/v1/completions", body)
    assert status == 200 and headers[b"x-llamacy-replica"] == b"r-test"
    with ServerThread(tiny_app) as srv:
        direct = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
    assert json.loads(payload)["choices"] == direct.json()["choices"]
    assert direct.headers["x-llamacy-replica"] == "r-test"

    status, _, payload, _ = _forward(tiny_app, "/v1/completions", {**body, "stream": True})
    events = [line for line in payload.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "data: [DONE]"
    text = "".join(
        json.loads(e[6:])["choices"][0]["text"] for e in events[:-1] if json.loads(e[6:])["choices"]
    )
    assert text == direct.json()["choices"][0]["text"]

    status, headers, payload, _ = _forward(tiny_app, "/v1/completions", {"prompt": 5})
    assert status == 400 and headers[b"x-llamacy-replica"] == b"r-test"


# ---- the job store's shared hook ------------------------------------------------------------------------


class FakeShared:
    def __init__(self) -> None:
        self.taken: set[str] = set()
        self.records: dict[str, dict] = {}
        self.forgotten: list[str] = []

    async def reserve(self, job_id: str) -> bool:
        if job_id in self.taken:
            return False
        self.taken.add(job_id)
        return True

    def publish(self, record: dict) -> None:
        self.records[record["id"]] = record

    def forget(self, job_id: str) -> None:
        self.forgotten.append(job_id)
        self.taken.discard(job_id)

    async def fetch(self, job_id: str) -> dict | None:
        return self.records.get(job_id)


def test_jobs_are_published_reserved_and_read_through_the_shared_store(tiny_app):
    shared = FakeShared()
    app = create_app(tiny_app.state.llamacy.models, settings=ServerSettings(), shared_jobs=shared)
    with ServerThread(app) as srv:
        r = httpx.post(f"{srv.url}/jobs", json={"id": "j1", "prompt": "hello", "max_tokens": 4}, timeout=30)
        assert r.status_code == 202
        for _ in range(200):
            if shared.records.get("j1", {}).get("status") == "done":
                break
            asyncio.run(asyncio.sleep(0.05))
        local = httpx.get(f"{srv.url}/jobs/j1", timeout=30).json()
        assert shared.records["j1"] == local  # the last record published is the finished job
        # An id another replica holds: 409 here too; a job only another replica has: read from the store.
        shared.taken.add("elsewhere")
        assert (
            httpx.post(f"{srv.url}/jobs", json={"id": "elsewhere", "prompt": "x"}, timeout=30).status_code
            == 409
        )
        shared.records["remote"] = {**local, "id": "remote", "response": "from another replica"}
        assert httpx.get(f"{srv.url}/jobs/remote", timeout=30).json()["response"] == "from another replica"
        status = httpx.get(f"{srv.url}/jobs/status/remote", timeout=30).json()
        assert set(status) == {"id", "status", "created_at", "started_at", "finished_at"}
        assert httpx.get(f"{srv.url}/jobs/nowhere", timeout=30).status_code == 404


def test_a_job_refused_after_its_reservation_frees_the_id():
    shared = FakeShared()
    store = JobStore(shared=shared)
    job = asyncio.run(store.create("j2", "p"))
    assert job.on_change is not None and "j2" in shared.taken
    store.discard("j2")
    assert shared.forgotten == ["j2"]
    with pytest.raises(APIError):
        store.get("j2")


# ---- the test cluster's socket check ---------------------------------------------------------------------


def test_the_socket_check_tells_loopback_from_the_rest():
    assert _addr("0100007F:1F90") == "127.0.0.1:8080"
    assert _addr("00000000000000000000000000000000:0050") == "[::]:80"
    assert _addr("0000000000000000FFFF00000100007F:0050") == "[::ffff:127.0.0.1]:80"
    assert _loopback_only("tcp", "LISTEN", "127.0.0.1:80", "0.0.0.0:0")
    assert _loopback_only("tcp6", "LISTEN", "[::ffff:127.0.0.1]:80", "[::]:0")
    assert not _loopback_only("tcp6", "LISTEN", "[::]:45341", "[::]:0")  # every interface
    assert not _loopback_only("tcp", "LISTEN", "0.0.0.0:80", "0.0.0.0:0")
    assert not _loopback_only("tcp", "ESTABLISHED", "10.0.0.5:4000", "10.0.0.9:6379")
    assert not _loopback_only("tcp", "SYN_SENT", "127.0.0.1:4000", "8.8.8.8:53")
    assert not _loopback_only("udp", "07", "0.0.0.0:5353", "0.0.0.0:0")


@pytest.mark.slow
def test_an_unreachable_cluster_is_one_line(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    (tmp_path / "p.txt").write_text("a\n")
    for args in (
        ["serve", "--ray", f"127.0.0.1:{closed}", "--port", str(closed)],
        ["batch", str(tmp_path / "p.txt"), "-o", str(tmp_path / "o.jsonl"), "--ray", f"127.0.0.1:{closed}"],
    ):
        r = subprocess.run(
            [sys.executable, "-m", "llamacy", *args], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"cannot reach the Ray cluster at 127.0.0.1:{closed}" in r.stderr
