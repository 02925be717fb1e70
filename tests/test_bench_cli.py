"""`llamacy bench` over several thread counts runs each test at the count it reports."""

from __future__ import annotations

import json

import pytest

from llamacy.cli import main
from llamacy.engine import Llama


def test_bench_builds_the_model_for_the_most_threads(tiny_model, monkeypatch, capsys):
    # The model sizes its scratch and the thread team for the threads it is built with and never uses
    # more, so with -t 1,2 it must be built for 2 before the first (1-thread) test lowers the count.
    built: list[int] = []
    new_model = Llama.new_model

    def record(self, n_ctx, n_threads, *args, **kwargs):
        built.append(n_threads)
        return new_model(self, n_ctx, n_threads, *args, **kwargs)

    monkeypatch.setattr(Llama, "new_model", record)
    path = tiny_model()
    with pytest.raises(SystemExit) as done:
        main(["bench", "-m", str(path), "-p", "8", "-n", "0", "-t", "1,2", "-r", "1", "-o", "json"])
    assert done.value.code in (0, None)
    assert built == [2]
    assert [r["n_threads"] for r in json.loads(capsys.readouterr().out)] == [1, 2]
