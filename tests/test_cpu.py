"""The CPU check that runs before any SIMD kernel module is imported."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

import llamacy.kernels as kernels
from llamacy.errors import CPUError
from llamacy.kernels import cpu
from tests.conftest import cpuinfo_flags


def test_feature_probe_matches_proc_cpuinfo():
    feats = cpu.cpu_features()
    assert set(feats) == {"avx2", "fma", "f16c"}
    assert all(isinstance(v, bool) for v in feats.values())
    assert cpu.has_avx2_fma() == all(feats.values())
    flags = cpuinfo_flags()
    if flags is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("no /proc/cpuinfo flags to compare with")
    assert feats == {"avx2": "avx2" in flags, "fma": "fma" in flags, "f16c": "f16c" in flags}


def test_simd_build_reported_without_simd_modules():
    from llamacy.kernels import quant

    assert isinstance(cpu.simd_build(), bool)
    assert cpu.simd_build() == quant.simd_build()


def test_ensure_cpu_raises_one_sentence(monkeypatch):
    monkeypatch.setattr(cpu, "simd_build", lambda: True)
    monkeypatch.setattr(cpu, "has_avx2_fma", lambda: False)
    with pytest.raises(CPUError) as info:
        kernels.ensure_cpu()
    msg = str(info.value)
    assert "AVX2/FMA" in msg and "LLAMACY_PORTABLE=1" in msg
    assert "\n" not in msg and msg.count(". ") == 0 and msg.endswith(".")


def test_ensure_cpu_passes_when_possible(monkeypatch):
    kernels.ensure_cpu()  # this machine runs the test suite, so it runs this build
    monkeypatch.setattr(cpu, "has_avx2_fma", lambda: False)
    monkeypatch.setattr(cpu, "simd_build", lambda: False)  # portable build: any CPU
    kernels.ensure_cpu()


def test_simd_modules_are_not_imported_on_a_cpu_without_avx2():
    """Importing a kernel module goes through the package __init__, whose check fails first."""
    code = """
import sys, types
fake = types.ModuleType("llamacy.kernels.cpu")
fake.simd_build = lambda: True
fake.has_avx2_fma = lambda: False
sys.modules["llamacy.kernels.cpu"] = fake
from llamacy.errors import CPUError
try:
    import llamacy.kernels.matmul
except CPUError as e:
    assert "llamacy.kernels.matmul" not in sys.modules
    assert "llamacy.kernels.quant" not in sys.modules
    print("CPUError:", e)
else:
    raise SystemExit("imported the SIMD module")
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("CPUError: This CPU lacks AVX2/FMA")
