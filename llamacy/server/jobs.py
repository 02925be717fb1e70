"""The job API's endpoints (the Go engine's): submit a prompt, poll its status, fetch the result.
The jobs themselves live in job_store.py; they run in the same schedulers as the OpenAI endpoints."""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import llamacy.server.generation as gen
from llamacy.server.job_store import STATUS_FIELDS
from llamacy.server.schemas import JobRequest, parse
from llamacy.server.state import state_of


async def create_job(request: Request) -> JSONResponse:
    state = state_of(request)
    body = parse(JobRequest, await request.body())
    t0 = time.perf_counter()
    served = await state.models.acquire(body.model)
    load_ms = (time.perf_counter() - t0) * 1000  # loading it, when this job is its first use
    job_id = body.id or str(uuid.uuid4())
    ids = await gen.encode_text(served, body.prompt)
    req = gen.build_request(served, body, ids, body.max_tokens)
    req.id = job_id
    job = await state.jobs.create(job_id, body.prompt, served.name, load_ms)
    try:
        call = await gen.start(served, [req])
    except BaseException:
        state.jobs.discard(job_id)
        raise
    job.handle = call.handles[0]
    job.follow(call)
    state.jobs.started(job)
    return JSONResponse({"id": job_id, "status": job.status}, status_code=202)


async def job_status(request: Request) -> JSONResponse:
    record = await state_of(request).jobs.lookup(request.path_params["job_id"])
    return JSONResponse({k: record[k] for k in STATUS_FIELDS})


async def job_result(request: Request) -> JSONResponse:
    return JSONResponse(await state_of(request).jobs.lookup(request.path_params["job_id"]))


ROUTES = [
    Route("/jobs", create_job, methods=["POST"]),
    Route("/jobs/status/{job_id}", job_status, methods=["GET"]),
    Route("/jobs/{job_id}", job_result, methods=["GET"]),
]
