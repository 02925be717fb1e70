"""`llamacy serve` with several models: the request's `model` picks one, each is loaded on first use with
its own scheduler, and unloaded when idle or when --max-memory needs room (least recently used first).
Real models (smollm2-135m and gemma3-270m) through the openai client, the job API and the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx
import pytest

openai = pytest.importorskip("openai")

from llamacy.cli.info import describe  # noqa: E402
from llamacy.cli.serve import model_name, parse_size  # noqa: E402
from llamacy.errors import UsageError  # noqa: E402
from llamacy.server import ModelRegistry, ServerSettings, ServerThread, create_app  # noqa: E402
from llamacy.server.loading import ModelLoader  # noqa: E402
from llamacy.server.models import ModelSpec  # noqa: E402
from tests.conftest import default_sigint  # noqa: E402
from tests.test_server import assert_error  # noqa: E402

pytestmark = pytest.mark.model
NAMES = ["smollm2-135m", "gemma3-270m"]
CTX, PARALLEL = 256, 2
PROMPT = "The capital of France is"


def footprint(source: str) -> int:
    mem = describe(source, CTX, "f16")["memory"]
    return mem["weights"] + mem["kv_cache"] * PARALLEL  # as `llamacy serve` counts it


@pytest.fixture(scope="module")
def both(default_model_path, gemma_model_path) -> list[ModelSpec]:
    return [ModelSpec(n, n, footprint(n)) for n in NAMES]


@pytest.fixture(scope="module")
def solo(both) -> dict[str, str]:
    """What each model answers alone (the single-sequence engine, greedy)."""
    from llamacy import Llama

    return {
        n: "".join(Llama(n, n_ctx=CTX, n_threads=1).generate(PROMPT, max_tokens=6, temperature=0))
        for n in NAMES
    }


@contextmanager
def serving(specs, **registry_options):
    registry = ModelRegistry(specs, ModelLoader(CTX, 1, "f16", PARALLEL, 8), **registry_options)
    srv = ServerThread(create_app(registry, settings=ServerSettings())).start()
    try:
        yield srv, registry
    finally:
        srv.stop()
        registry.close()


def loaded(url: str) -> dict[str, bool]:
    return {m["id"]: m["loaded"] for m in httpx.get(url + "/v1/models").json()["data"]}


def ask(cli, model: str | None, **kw) -> str:
    extra = {"model": model} if model else {}
    r = cli.with_options(max_retries=0).post(
        "/completions",
        body={"prompt": PROMPT, "max_tokens": 6, "temperature": 0, **extra, **kw},
        cast_to=object,
    )
    return r["choices"][0]["text"] if "choices" in r else r


@pytest.mark.slow
def test_model_field_picks_the_model_loaded_on_first_use(both, solo):
    with serving(both) as (srv, registry):
        cli = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        assert [m.id for m in cli.models.list().data] == NAMES
        assert loaded(srv.url) == {n: False for n in NAMES}  # nothing loaded before its first request
        r = cli.completions.create(model="gemma3-270m", prompt=PROMPT, max_tokens=6, temperature=0)
        assert r.model == "gemma3-270m" and r.choices[0].text == solo["gemma3-270m"]
        assert loaded(srv.url) == {"smollm2-135m": False, "gemma3-270m": True}
        r = cli.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        assert r.model == "smollm2-135m"
        # No `model`: the first one. Each model has its own scheduler.
        assert ask(cli, None) == solo["smollm2-135m"]
        scheds = [m.scheduler for m in registry.loaded()]
        assert len({id(s) for s in scheds}) == 2 and all(s.alive for s in scheds)
        # The job API picks by `model` too; the job that loads nothing reports no load time.
        job = httpx.post(
            srv.url + "/jobs",
            json={"prompt": PROMPT, "model": "gemma3-270m", "max_tokens": 6, "temperature": 0},
        ).json()
        deadline = time.monotonic() + 60
        while (res := httpx.get(f"{srv.url}/jobs/{job['id']}").json())["status"] in ("pending", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert res["response"] == solo["gemma3-270m"] and res["model"] == "gemma3-270m"
        assert res["stats"]["load_time_ms"] == 0
        # An unknown model: 404 naming the known ones, for every kind of endpoint.
        with pytest.raises(openai.NotFoundError) as e:
            cli.completions.create(model="llama-9000", prompt="x", max_tokens=1)
        assert e.value.body["code"] == "model_not_found"
        for path, body in [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
            ("/jobs", {"prompt": "x"}),
            ("/tokenize", {"content": "x"}),
        ]:
            err = assert_error(
                httpx.post(srv.url + path, json={**body, "model": "llama-9000"}), 404, "llama-9000"
            )
            assert "known models: smollm2-135m, gemma3-270m" in err["message"]
            assert err["type"] == "not_found_error" and err["param"] == "model"
        text = httpx.get(srv.url + "/metrics").text
        assert 'llamacy_model_loaded{model="gemma3-270m"} 1' in text
        assert 'llamacy_generated_tokens_total{model="gemma3-270m"}' in text


@pytest.mark.slow
def test_max_memory_unloads_the_least_recently_used(both, solo):
    # Room for the larger model alone: loading one unloads the other.
    budget = max(s.footprint for s in both) + (1 << 20)
    assert sum(s.footprint for s in both) > budget
    with serving(both, max_memory=budget) as (srv, registry):
        cli = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        assert ask(cli, "smollm2-135m") == solo["smollm2-135m"]
        first = registry.loaded()[0].scheduler
        assert ask(cli, "gemma3-270m") == solo["gemma3-270m"]
        assert loaded(srv.url) == {"smollm2-135m": False, "gemma3-270m": True}
        assert not first.alive  # its scheduler was shut down
        # Loaded again on demand, the same answer; job load time counts the load it waited for.
        job = httpx.post(srv.url + "/jobs", json={"prompt": PROMPT, "model": "smollm2-135m", "max_tokens": 2})
        assert job.status_code == 202
        assert loaded(srv.url) == {"smollm2-135m": True, "gemma3-270m": False}
        deadline = time.monotonic() + 60
        while (res := httpx.get(f"{srv.url}/jobs/{job.json()['id']}").json())["status"] in (
            "pending",
            "running",
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (
            res["stats"]["load_time_ms"] > 0 and res["stats"]["total_time_ms"] >= res["stats"]["load_time_ms"]
        )
        # A busy model is never unloaded: while a stream holds smollm2, gemma cannot get room (503).
        # (Its steps slowed down, so that the stream cannot end meanwhile, into the socket's buffer.)
        sched = registry.loaded()[0].scheduler
        step = sched.step
        sched.step = lambda: (time.sleep(0.02), step())
        body = {
            "model": "smollm2-135m",
            "prompt": PROMPT,
            "max_tokens": 200,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()  # kept: a dropped iterator closes the connection
            assert next(lines).startswith("data: ")
            busy = httpx.post(
                srv.url + "/v1/completions", json={"model": "gemma3-270m", "prompt": "x"}, timeout=60
            )
            err = assert_error(busy, 503, "not enough memory")
            assert err["code"] == "insufficient_memory" and "smollm2-135m" in err["message"]
            assert busy.headers["Retry-After"]
        assert ask(cli, "gemma3-270m") == solo["gemma3-270m"]  # the stream is over: room again


class _StubScheduler:
    def __init__(self) -> None:
        self.alive = True

    def shutdown(self) -> None:
        self.alive = False


def test_a_load_waits_for_a_model_that_is_just_going_idle(monkeypatch):
    """Room held by a busy model: the load waits for it to go idle (a request just ending) rather than
    answering 503 at once; one that stays busy past ROOM_WAIT_S gets the 503."""
    import threading

    import llamacy.server.models as models
    from llamacy.server.errors import APIError
    from llamacy.server.models import ServedModel, holding

    specs = [ModelSpec("a", "a", 10), ModelSpec("b", "b", 10)]
    registry = ModelRegistry(
        specs, lambda spec: ServedModel(spec.name, _StubScheduler(), None), max_memory=15
    )
    with holding() as release:
        a = registry.get("a")
        assert a.busy
        threading.Timer(0.3, release).start()  # the request holding it ends meanwhile
        t0 = time.monotonic()
        b = registry.get("b")
    assert 0.25 < time.monotonic() - t0 < models.ROOM_WAIT_S
    assert b.name == "b" and not a.scheduler.alive and not registry.is_loaded("a")
    monkeypatch.setattr(models, "ROOM_WAIT_S", 0.2)
    with holding():
        registry.get("b")
        t0 = time.monotonic()
        with pytest.raises(APIError) as e:
            registry.get("a")
        assert e.value.status == 503 and time.monotonic() - t0 >= 0.2
    assert registry.get("a").name == "a"  # b idle again: unloaded to make room


@pytest.mark.slow
def test_idle_models_are_unloaded(both, solo):
    with serving(both, idle_unload_s=0.5) as (srv, _registry):
        cli = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        assert ask(cli, "gemma3-270m") == solo["gemma3-270m"]
        assert loaded(srv.url)["gemma3-270m"]
        deadline = time.monotonic() + 10
        while loaded(srv.url)["gemma3-270m"]:
            assert time.monotonic() < deadline, "not unloaded after 0.5 s idle"
            time.sleep(0.1)
        assert ask(cli, "gemma3-270m") == solo["gemma3-270m"]  # and back on the next request


def test_names_and_sizes():
    assert model_name("smollm2-135m") == "smollm2-135m"
    assert model_name("/models/Qwen2-0.5B.Q8_0.gguf") == "Qwen2-0.5B.Q8_0"
    assert parse_size("512M") == 512 << 20 and parse_size("1.5GiB") == 3 << 29 and parse_size("1000") == 1000
    for bad in ("lots", "-1G", "0", "5X"):
        with pytest.raises(UsageError, match="--max-memory"):
            parse_size(bad)
    with pytest.raises(ValueError, match="same name"):
        ModelRegistry([ModelSpec("a", "x"), ModelSpec("a", "y")])


def _serve(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "llamacy", "serve", "--port", "0", "--threads", "1", "-c", str(CTX), *args]
    # Stopped with SIGINT, whatever runs the test (a background job inherits it ignored).
    return subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        preexec_fn=default_sigint,
    )


@pytest.mark.slow
def test_serve_command_with_two_models(both, solo, tmp_path):
    listing = tmp_path / "models.txt"
    listing.write_text("# the second model\ngemma3-270m\n")
    budget = max(s.footprint for s in both) // 2**20 + 1
    proc = _serve(
        "-m",
        "smollm2-135m",
        "--models",
        str(listing),
        "--parallel",
        str(PARALLEL),
        "--max-memory",
        f"{budget}M",
        "--idle-unload",
        "60",
    )
    try:
        line = proc.stderr.readline()
        assert "serving smollm2-135m [256 tokens], gemma3-270m [256 tokens] at http://127.0.0.1:" in line, (
            line
        )
        url = line.split(" at ")[1].split()[0].removesuffix("/v1")
        cli = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        assert [m.id for m in cli.models.list().data] == NAMES
        assert ask(cli, "gemma3-270m") == solo["gemma3-270m"]
        assert ask(cli, "smollm2-135m") == solo["smollm2-135m"]
        assert loaded(url) == {"smollm2-135m": True, "gemma3-270m": False}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()
    # Refusals before anything loads: a budget no model fits in, one name twice.
    for args, message in [
        (("-m", "gemma3-270m", "--max-memory", "10M"), "needs about"),
        (("-m", "smollm2-135m", "-m", "smollm2-135m"), "two models are named 'smollm2-135m'"),
    ]:
        p = _serve(*args)
        _out, err = p.communicate(timeout=60)
        assert p.returncode != 0 and message in err and err.count("\n") == 1, err
