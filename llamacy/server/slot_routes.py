"""llama-server's slot endpoints: GET /slots, and POST /slots/{id_slot}?action=save|restore|erase with
{"filename": ...} in its request and response shapes. Files live in --slot-save-path only: a name is one
plain file name (no separators, no `..`, no leading dot or space), a symbolic link is refused, and the
resolved path must be inside the directory. The files are llamacy/model/memory_file.py's: one of another
model or KV type, truncated or corrupt, is refused with a 400 and the slot is left as it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from llamacy.errors import LlamacyError
from llamacy.model.memory_file import load_memory, model_identity, save_memory
from llamacy.server.errors import APIError
from llamacy.server.state import state_of

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")


def slot_file(directory: str, name: object) -> Path:
    """The path of a slot file named by a client, or APIError 400 if the name could leave the directory."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise APIError(400, "Invalid filename: give a plain file name", "invalid_value", "filename")
    root = Path(os.path.realpath(directory))
    path = root / name
    if path.is_symlink() or Path(os.path.realpath(path)).parent != root:
        raise APIError(
            400, "Invalid filename: it leads outside the slot save path", "invalid_value", "filename"
        )
    return path


async def list_slots(request: Request) -> JSONResponse:
    served = await state_of(request).models.acquire(request.query_params.get("model"))
    return JSONResponse(served.scheduler.slots())


async def slot_action(request: Request) -> JSONResponse:
    state = state_of(request)
    directory = state.settings.slot_save_path
    action = request.query_params.get("action")
    if action not in ("save", "restore", "erase"):
        raise APIError(400, "action must be save, restore or erase", "invalid_value", "action")
    if directory is None and action != "erase":
        raise APIError(501, "This server does not support slots action: start it with --slot-save-path", None)
    try:
        slot = int(request.path_params["id_slot"])
    except ValueError:
        raise APIError(400, "id_slot must be an integer", "invalid_value", "id_slot") from None
    body = await request.body()
    try:
        data = json.loads(body) if body.strip() else {}
    except ValueError:
        raise APIError(400, "the body is not JSON", "invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object", "invalid_json")
    served = await state.models.acquire(data.get("model") if isinstance(data.get("model"), str) else None)
    sched = served.scheduler
    if not 0 <= slot < sched.n_parallel:
        raise APIError(
            400, f"id_slot must be between 0 and {sched.n_parallel - 1}", "invalid_value", "id_slot"
        )
    t0 = time.perf_counter()
    if action == "erase":

        def erase(kv, s):
            n = kv.length(s)
            kv.clear(s)
            return n

        n = await _run(sched, slot, erase, None)
        return JSONResponse({"id_slot": slot, "n_erased": n})
    path = slot_file(directory, data.get("filename"))
    ident = await asyncio.to_thread(model_identity, sched.gguf)
    if action == "save":

        def save(kv, s):
            return kv.length(s), save_memory(path, kv, s, ident, sched.arch)

        n, size = await _run(sched, slot, save, path)
        ms = {"save_ms": round((time.perf_counter() - t0) * 1000, 3)}
        return JSONResponse(
            {"id_slot": slot, "filename": path.name, "n_saved": n, "n_written": size, "timings": ms}
        )
    if not path.is_file():
        raise APIError(400, f"no slot file {path.name!r} in the slot save path", "invalid_value", "filename")

    def restore(kv, s):
        return len(load_memory(path, kv, s, ident, sched.arch).tokens), path.stat().st_size

    n, size = await _run(sched, slot, restore, path)
    ms = {"restore_ms": round((time.perf_counter() - t0) * 1000, 3)}
    return JSONResponse(
        {"id_slot": slot, "filename": path.name, "n_restored": n, "n_read": size, "timings": ms}
    )


async def _run(sched, slot: int, work, path: Path | None):
    try:
        return await asyncio.wrap_future(sched.on_slot(slot, work))
    except LlamacyError as e:
        message = (
            str(e).replace(str(path), path.name) if path is not None else str(e)
        )  # not the server's paths
        raise APIError(400, message, "invalid_slot_file") from None
    except OSError as e:
        raise APIError(500, f"slot file: {e.strerror}", "slot_file_error") from None


ROUTES = [
    Route("/slots", list_slots, methods=["GET"]),
    Route("/slots/{id_slot}", slot_action, methods=["POST"]),
]
