"""The sampler's top-k kernel against a full sort: same ids, same order, same NaN refusal."""

from __future__ import annotations

import numpy as np
import pytest
from llamacy.kernels.topk import MAX_K, top_k

from llamacy.sampling import Sampler, SamplingParams


def _oracle(x: np.ndarray, k: int) -> np.ndarray:
    """Value descending, then id ascending: the sampler's canonical order, by a full sort."""
    return np.lexsort((np.arange(len(x)), -x.astype(np.float64)))[:k]


def _case(rng: np.random.Generator, kind: int, n: int) -> np.ndarray:
    if kind == 0:
        return (rng.standard_normal(n) * 3).astype(np.float32)
    if kind == 1:  # few distinct values: ties at every cut
        return rng.integers(-3, 3, n).astype(np.float32)
    if kind == 2:  # ascending: every entry displaces one (the kernel's worst case)
        return np.sort(rng.standard_normal(n)).astype(np.float32)
    if kind == 3:  # masked tokens
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.integers(0, n, n // 2)] = -np.inf
        return x
    x = np.zeros(n, dtype=np.float32)  # all equal: the lowest ids win
    x[rng.integers(0, n, 3)] = np.float32(-0.0)
    return x


@pytest.mark.parametrize("trial", range(200))
def test_top_k_matches_a_full_sort(trial: int) -> None:
    rng = np.random.default_rng(trial)
    n = int(rng.choice([1, 7, 8, 9, 40, 41, 255, 1000, 49_152]))
    k = int(rng.integers(1, MAX_K + 1)) if trial % 2 else int(rng.choice([1, 2, 40, 64]))
    x = _case(rng, trial % 5, n)
    ids, vals = top_k(x, k)
    ref = _oracle(x, k)
    assert ids.dtype == np.int64 and vals.dtype == np.float32
    np.testing.assert_array_equal(ids, ref)
    np.testing.assert_array_equal(vals, x[ref])


@pytest.mark.parametrize("where", [0, 5, 39, 40, 47, 48, 1000, 1003])
def test_a_nan_anywhere_is_reported(where: int) -> None:
    x = np.random.default_rng(where).standard_normal(1004).astype(np.float32)
    x[where] = np.nan
    assert top_k(x, 40) is None


def test_empty_row_and_bad_k() -> None:
    ids, vals = top_k(np.zeros(0, dtype=np.float32), 5)
    assert len(ids) == 0 and len(vals) == 0
    for k in (0, -1, MAX_K + 1):
        with pytest.raises(ValueError, match="k must be"):
            top_k(np.zeros(10, dtype=np.float32), k)


@pytest.mark.parametrize(
    ("logits", "message"),
    [
        ([0.0, np.inf, 1.0, 2.0, 3.0], r"\+inf"),
        ([-np.inf] * 5, "all -inf"),
        ([0.0, 1.0, 2.0, 3.0, np.nan], "NaN"),
    ],
)
def test_the_top_k_path_refuses_what_the_full_check_refuses(logits: list[float], message: str) -> None:
    x = np.array(logits, dtype=np.float32)
    for params in (SamplingParams(seed=0, top_k=2), SamplingParams(seed=0, top_k=0, top_p=1.0, min_p=0.0)):
        with pytest.raises(ValueError, match=message):
            Sampler(params, len(x)).sample(x, [])


def test_non_contiguous_and_float64_logits_are_accepted() -> None:
    rng = np.random.default_rng(3)
    wide = (rng.standard_normal((2, 1000)) * 2).astype(np.float32)
    a = Sampler(SamplingParams(seed=9), 500).distribution(wide[0, ::2])
    b = Sampler(SamplingParams(seed=9), 500).distribution(
        np.ascontiguousarray(wide[0, ::2]).astype(np.float64)
    )
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
