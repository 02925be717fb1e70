"""Batch jobs: many prompts from a file, results appended to a JSONL file that survives crashes.

Each result is one JSON line, written whole and flushed to disk before the next, so a crash or Ctrl-C
loses at most the items in flight. Running the same command again skips the ids already in the results
(a torn last line from a crash is cut off first) and appends the rest. Prompts decode together through
the continuous-batching scheduler, so a batch finishes faster than the same prompts one by one.
"""

from __future__ import annotations

import json
import os
import queue
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TextIO

from llamacy.errors import LlamacyError, UsageError
from llamacy.sampling import SamplingParams

# Per-item fields a JSONL prompt may carry, besides id and prompt.
SAMPLING_FIELDS = {f.name for f in fields(SamplingParams)}
ITEM_FIELDS = SAMPLING_FIELDS | {"max_tokens", "stop", "response_format", "speculate", "draft_max", "ngram"}


@dataclass
class Item:
    id: Any  # str or int, as given (text files: the 1-based line number)
    prompt: str | None
    options: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the item could not even be read: reported, never run


def _key(item_id: Any) -> str:
    # Ids compare as JSON values: 1 and "1" are different ids.
    return json.dumps(item_id)


def read_items(path: Path, fmt: str = "auto") -> list[Item]:
    """Prompts from a text file (one per line; blank lines skipped) or JSONL ({"id", "prompt", ...})."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    text = raw.decode("utf-8", errors="replace")
    lines = text.splitlines()
    if fmt == "auto":
        fmt = "jsonl" if path.suffix in (".jsonl", ".json") else "text"
    items: list[Item] = []
    if fmt == "text":
        items = [Item(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    elif fmt == "jsonl":
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            items.append(_parse_json_item(line, n))
    else:
        raise UsageError(f"--format must be auto, text or jsonl, got {fmt!r}")
    seen: set[str] = set()
    for it in items:
        k = _key(it.id)
        if k in seen:
            raise UsageError(f"{path}: the id {it.id!r} appears more than once")
        seen.add(k)
    if not items:
        raise UsageError(f"{path}: no prompts")
    return items


def _parse_json_item(line: str, n: int) -> Item:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return Item(f"line-{n}", None, error=f"line {n} is not valid JSON: {e.msg}")
    if not isinstance(obj, dict):
        return Item(f"line-{n}", None, error=f"line {n} is not a JSON object")
    item_id = obj.get("id", n)
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
        return Item(f"line-{n}", None, error=f"line {n}: id must be a string or an integer")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str):
        return Item(item_id, None, error="prompt must be a string")
    unknown = set(obj) - ITEM_FIELDS - {"id", "prompt"}
    if unknown:
        return Item(item_id, prompt, error=f"unknown fields: {', '.join(sorted(unknown))}")
    return Item(item_id, prompt, {k: v for k, v in obj.items() if k in ITEM_FIELDS})


def done_ids(results: Path, repair: bool = True) -> set[str]:
    """Ids with a result line already. A torn final line (a crash mid-write) is cut off when repair."""
    if not results.exists():
        return set()
    data = results.read_bytes()
    ids: set[str] = set()
    good_end = 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl + 1
        line = data[pos:end]
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict) or "id" not in obj:
                raise ValueError
        except ValueError:
            if nl < 0 or end == len(data):  # only the last line may be torn
                break
            line_no = data[:pos].count(b"\n") + 1
            raise LlamacyError(f"{results}: line {line_no} is not a result; not appending to it") from None
        ids.add(_key(obj["id"]))
        good_end = end
        pos = end
    if repair and good_end < len(data):
        with open(results, "r+b") as f:
            f.truncate(good_end)
    return ids


class ResultWriter:
    """Appends one JSON line per result, whole and on disk before returning."""

    def __init__(self, path: Path) -> None:
        try:
            self.f: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror}") from None

    def write(self, obj: dict[str, Any]) -> None:
        self.f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


@dataclass
class BatchSummary:
    total: int = 0
    skipped: int = 0  # already in the results
    done: int = 0
    errors: int = 0
    steps: int = 0  # batched model steps taken (fewer than tokens generated when prompts shared steps)
    tokens: int = 0  # tokens generated

    def count(self, result: dict[str, Any]) -> None:
        if "error" in result:
            self.errors += 1
        else:
            self.done += 1
            self.tokens += result["completion_tokens"]


@dataclass(frozen=True)
class BatchModel:
    """The model a batch runs and how prompts reach it (`llamacy batch`'s options). Plain values, so that
    a Ray worker can load the same thing (llamacy/distributed/ray_batch.py)."""

    model: str | None = None  # a GGUF path or a known name; None: the default model
    n_ctx: int | None = None
    n_threads: int | None = None
    kv_type: str = "f16"
    chat: bool = False  # each prompt a user turn through the model's chat template
    system: str | None = None  # with chat: a system prompt for every item

    def load(self) -> tuple[Any, Callable[[str], list[int]] | None, list[str]]:
        """(the Llama, its prompt encoder or None for plain text, stop strings the template adds)."""
        from llamacy.engine import Llama

        llm = Llama(self.model, n_ctx=self.n_ctx, n_threads=self.n_threads, kv_type=self.kv_type)
        if not self.chat:
            return llm, None, []
        from llamacy.chat_template import ChatTemplate

        template = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
        sys_msgs = [{"role": "system", "content": self.system}] if self.system else []

        def encode(text: str) -> list[int]:
            messages = [*sys_msgs, {"role": "user", "content": text}]
            return template.encode(template.render(messages, add_generation_prompt=True))

        return llm, encode, list(template.stop_strings or [])


def run_batch(
    llm: Any,
    items: list[Item],
    results: Path,
    defaults: dict[str, Any],
    n_parallel: int = 4,
    n_ctx: int | None = None,
    encode: Callable[[str], list[int]] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    draft: Any = None,
) -> BatchSummary:
    """Run the items not yet in `results` through a Scheduler; append each result as it finishes.

    encode: prompt text -> token ids (e.g. through a chat template); default: the model's tokenizer."""
    todo, summary = pending(items, results)
    append_results(
        iter_results(llm, todo, defaults, n_parallel, n_ctx, encode, summary, draft),
        results,
        summary,
        on_result,
    )
    return summary


def pending(items: list[Item], results: Path) -> tuple[list[Item], BatchSummary]:
    """The items not yet in `results`, and a summary that counts the others as skipped."""
    finished = done_ids(results)
    todo = [it for it in items if _key(it.id) not in finished]
    return todo, BatchSummary(total=len(items), skipped=len(items) - len(todo))


def append_results(
    results: Iterable[dict[str, Any]],
    path: Path,
    summary: BatchSummary,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Append each result to `path` as it comes, on disk before the next one is taken. An id seen
    before in this run is dropped: a worker that died and was restarted runs its items again."""
    writer = ResultWriter(path)
    written: set[str] = set()
    try:
        for result in results:
            key = _key(result["id"])
            if key in written:
                continue
            written.add(key)
            writer.write(result)
            summary.count(result)
            if on_result is not None:
                on_result(result)
    finally:
        writer.close()


def iter_results(
    llm: Any,
    items: list[Item],
    defaults: dict[str, Any],
    n_parallel: int = 4,
    n_ctx: int | None = None,
    encode: Callable[[str], list[int]] | None = None,
    summary: BatchSummary | None = None,
    draft: Any = None,
) -> Iterator[dict[str, Any]]:
    """Each item's result line, as it finishes (an item that cannot run: at once), through a Scheduler
    that decodes n_parallel prompts together. `summary`, if given, gets the count of model steps; `draft`:
    a Llama that drafts for items with speculate "draft"."""
    from llamacy.scheduler import Done, Scheduler

    sched = Scheduler(llm, n_parallel=n_parallel, n_ctx=n_ctx, queue_size=max(1, 2 * n_parallel), draft=draft)
    finals: queue.SimpleQueue[tuple[Item, Any]] = queue.SimpleQueue()
    in_flight = 0
    try:
        sched.start()
        pending = iter(items)
        exhausted = False
        while True:
            # Keep the slots and a small queue busy; an item that cannot run is answered at once.
            while not exhausted and in_flight < 2 * n_parallel:
                it = next(pending, None)
                if it is None:
                    exhausted = True
                    break
                try:
                    req = _request(llm, it, defaults, encode or llm.tokenize)
                    sched.submit(req, listener=_on_final(finals, it))
                except LlamacyError as e:
                    yield {"id": it.id, "prompt": it.prompt, "error": str(e)}
                    continue
                in_flight += 1
            if in_flight == 0:
                break
            it, final = finals.get()
            in_flight -= 1
            if isinstance(final, Done):
                yield {
                    "id": it.id,
                    "prompt": it.prompt,
                    "completion": final.text,
                    "finish_reason": final.finish_reason,
                    "prompt_tokens": final.usage.prompt_tokens,
                    "completion_tokens": final.usage.completion_tokens,
                    "seed": final.seed,
                    "timings": final.timings.as_dict(),
                }
            else:
                yield {"id": it.id, "prompt": it.prompt, "error": final.message}
    finally:
        sched.shutdown()
        if summary is not None:
            summary.steps = sched.steps_total


def _on_final(finals: queue.SimpleQueue, it: Item) -> Callable[[Any], None]:
    """A scheduler listener that forwards only the last event (Done or Failed) of one item."""
    from llamacy.scheduler import Done, Failed

    def listener(ev: Any) -> None:
        if isinstance(ev, Done | Failed):
            finals.put((it, ev))

    return listener


def _request(llm: Any, it: Item, defaults: dict[str, Any], encode: Callable[[str], list[int]]) -> Any:
    from llamacy.generation import sampling_params
    from llamacy.generation.speculate import speculation
    from llamacy.scheduler import GenerationRequest
    from llamacy.structured import Constraint, response_format_grammar

    if it.error is not None:
        raise UsageError(it.error)
    opts = {**defaults, **it.options}
    max_tokens = opts.pop("max_tokens", None)
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < -1
    ):
        raise UsageError(f"max_tokens must be an integer >= -1, got {max_tokens!r}")
    stop = opts.pop("stop", None) or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise UsageError("stop must be a string or a list of strings")
    # OpenAI's response_format ({"type": "json_object"} or "json_schema"): this item's output is that JSON.
    grammar = response_format_grammar(opts.pop("response_format", None))
    mode, draft_model = opts.pop("speculate", None), opts.pop("draft_model", None)
    # The batch's draft model serves the items that draft with it; an item may choose prompt lookup.
    spec = speculation(
        mode, opts.pop("draft_max", None), opts.pop("ngram", None), draft_model if mode == "draft" else None
    )
    try:
        params = sampling_params(opts)
    except (TypeError, ValueError) as e:
        raise UsageError(f"bad sampling options: {e}") from None
    ids = encode(it.prompt)
    return GenerationRequest(
        prompt=ids,
        params=params,
        max_tokens=None if max_tokens == -1 else max_tokens,
        stop=stop,
        id=str(it.id),
        constraint=None if grammar is None else Constraint(grammar, llm.tokenizer, llm.n_vocab),
        speculate=spec,
    )
