"""`llamacy batch --ray`: the same resumable batch, on a Ray cluster with Ray Data.

The items not yet in the results go into a dataset; map_batches runs them through a pool of `replicas`
BatchWorker actors (T CPUs each), each of which holds the model and decodes --parallel prompts together
with the same scheduler and request rules as the local batch (llamacy.batch.iter_results): same result
lines, greedy results identical. Each worker yields every result as it finishes, and each goes on its own
to the driver, which appends it to the results at once: an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

from llamacy.batch import BatchModel, BatchSummary, Item, append_results, iter_results, pending
from llamacy.distributed.cluster import cluster_cpus, connect
from llamacy.errors import UsageError

ITEMS_PER_CALL = 4  # a worker's call takes this many times --parallel items (fewer when they run out)


class BatchWorker:
    """One model copy in the actor pool."""

    def __init__(self, spec: BatchModel, defaults: dict[str, Any], parallel: int) -> None:
        self.llm, self.encode, stops = spec.load()
        self.defaults = dict(defaults)
        if stops:
            self.defaults["stop"] = [*self.defaults.get("stop", []), *stops]
        self.parallel = parallel

    def __call__(self, batch: dict[str, Any]) -> Iterator[dict[str, list[str]]]:
        items = [Item(**json.loads(s)) for s in batch["item"]]
        for result in iter_results(
            self.llm, items, self.defaults, self.parallel, self.llm.n_ctx, self.encode
        ):
            yield {"result": [json.dumps(result, ensure_ascii=False)]}


def run_batch_on_ray(
    address: str,
    items: list[Item],
    results: Path,
    defaults: dict[str, Any],
    spec: BatchModel,
    replicas: int,
    parallel: int,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> BatchSummary:
    """llamacy.batch.run_batch, on the cluster at `address` (-t threads per worker; 1 if not given)."""
    spec = dataclasses.replace(spec, n_threads=spec.n_threads or 1)
    todo, summary = pending(items, results)
    if not todo:
        return summary
    connect(address)
    try:
        cpus = cluster_cpus()
        if replicas * spec.n_threads > cpus:
            raise UsageError(
                f"{replicas} workers x {spec.n_threads} threads need {replicas * spec.n_threads} CPUs, and the "
                f"Ray cluster at {address} has {cpus}"
            )
        rows = _dataset(todo, defaults, spec, replicas, parallel).iter_rows()
        append_results((json.loads(row["result"]) for row in rows), results, summary, on_result)
    finally:
        ray.shutdown()
    return summary


def _dataset(
    todo: list[Item], defaults: dict[str, Any], spec: BatchModel, replicas: int, parallel: int
) -> Any:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the command has its own (on a terminal only)
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # not even the note that progress bars are off
    # Every yielded result its own block: results reach the driver one by one, as they finish, rather
    # than when a block fills up.
    ctx.target_max_block_size = 1
    per_call = max(1, min(ITEMS_PER_CALL * parallel, math.ceil(len(todo) / replicas)))
    rows = [{"item": json.dumps(dataclasses.asdict(it), ensure_ascii=False)} for it in todo]
    ds = ray.data.from_items(rows, override_num_blocks=math.ceil(len(rows) / per_call))
    return ds.map_batches(
        BatchWorker,
        fn_constructor_kwargs={"spec": spec, "defaults": defaults, "parallel": parallel},
        batch_size=per_call,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=replicas),
        num_cpus=spec.n_threads,
    )
