"""`llamacy serve`: an OpenAI-compatible HTTP server (plus the job API) that many clients share."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from llamacy.cli import options as opt


def serve(
    model: str = opt.MODEL,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", help="TCP port; 0 picks a free one."),
    parallel: int = typer.Option(4, "--parallel", "-np", help="Sequences generated at once (batched)."),
    threads: int = opt.THREADS,
    ctx_size: int = typer.Option(
        None,
        "--ctx-size",
        "-c",
        help="Context size of each sequence in tokens (default: min(model's, 4096)).",
    ),
    kv_type: str = opt.KV_TYPE,
    queue_size: int = typer.Option(
        64, "--queue-size", help="Requests that may wait for a slot; more get 429."
    ),
    api_key: str = typer.Option(
        None,
        "--api-key",
        envvar="LLAMACY_API_KEY",
        help="Require 'Authorization: Bearer KEY' (env LLAMACY_API_KEY).",
    ),
    chat_template: Path = typer.Option(
        None, "--chat-template", help="A Jinja chat template file, instead of the model's own."
    ),
    job_ttl: float = typer.Option(3600.0, "--job-ttl", help="Seconds a finished job's result is kept."),
) -> None:
    from llamacy.errors import UsageError

    opt.check_counts(threads, ctx_size)
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {port}")
    if not 1 <= parallel <= 256:
        raise UsageError(f"--parallel must be between 1 and 256, got {parallel}")
    if queue_size < 1:
        raise UsageError(f"--queue-size must be at least 1, got {queue_size}")
    if job_ttl < 0:
        raise UsageError(f"--job-ttl must be at least 0, got {job_ttl}")

    from llamacy.chat_template import ChatTemplate
    from llamacy.engine import Llama
    from llamacy.scheduler import Scheduler
    from llamacy.server import ServerSettings, bind, create_app, serve_forever
    from llamacy.server.runner import url_of

    sock = bind(host, port)  # before loading: a port in use fails fast
    llm = Llama(model, n_ctx=ctx_size, n_threads=threads, kv_type=kv_type)  # the scheduler builds the Model
    template = ChatTemplate.from_model(llm.metadata, llm.tokenizer, override=chat_template)
    scheduler = Scheduler(llm, n_parallel=parallel, n_ctx=llm.n_ctx, queue_size=queue_size)
    settings = ServerSettings(api_key=api_key or None, job_ttl_s=job_ttl, model_name=llm.model_path.stem)
    app = create_app(scheduler, template, settings)
    sys.stderr.write(
        f"llamacy: serving {llm.model_path.name} at {url_of(sock)}/v1 "
        f"({parallel} parallel x {llm.n_ctx} tokens, {llm.kv_type} KV cache, {scheduler.n_threads} "
        f"thread{'s' if scheduler.n_threads != 1 else ''}"
        f"{', API key required' if api_key else ''})\n"
    )
    sys.stderr.flush()
    scheduler.start()
    try:
        serve_forever(app, sock)
    except KeyboardInterrupt:
        pass  # uvicorn re-raises Ctrl-C after its graceful shutdown: stopping a server is a success
    finally:
        scheduler.shutdown()
        sock.close()
