"""`llamacy serve`: an OpenAI-compatible HTTP server (plus the job API) that many clients share, for one
model or several (each loaded on first use, with its own scheduler)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer

from llamacy.cli import options as opt

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'2G', '512MiB', '1.5g', '1000000' -> bytes (K, M, G, T: powers of 1024)."""
    from llamacy.errors import UsageError

    m = _SIZE.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise UsageError(f"--max-memory must be a size such as 4G, 512M or a number of bytes, got {text!r}")
    return int(float(m.group(1)) * 1024 ** "_KMGT".index(m.group(2).upper() or "_"))


def model_name(source: str) -> str:
    """The name requests use: a catalog name as given, else the file's stem (models/foo.gguf -> foo), a
    split model's without its part number (models/foo-00001-of-00003.gguf -> foo)."""
    from llamacy.catalog import KNOWN_MODELS
    from llamacy.hub.names import SPLIT_RE

    if source in KNOWN_MODELS:
        return source
    path = Path(source)
    m = SPLIT_RE.search(path.name)
    return path.name[: m.start()] if m is not None and m.start() > 0 else path.stem


def read_models_file(path: Path) -> list[str]:
    from llamacy.errors import UsageError

    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise UsageError(f"cannot read --models file {path}: {e.strerror or e}") from None
    return [s for line in lines if (s := line.split("#", 1)[0].strip())]


def serve(
    models: list[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="A GGUF file or a known model name (default: smollm2-135m). Repeat it to serve several: a "
        "request's `model` field picks one by name, which is the known name as given (smollm2-135m) or "
        "the file's stem (models/foo.gguf -> foo); a request without one gets the first.",
    ),
    models_file: Path = typer.Option(
        None, "--models", help="A file of models to serve, one -m value per line (# comments)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", help="TCP port; 0 picks a free one."),
    parallel: int = typer.Option(4, "--parallel", "-np", help="Sequences generated at once per model."),
    threads: int = opt.THREADS,
    ctx_size: int = typer.Option(
        None,
        "--ctx-size",
        "-c",
        help="Context size of each sequence in tokens (default: min(model's, 4096)).",
    ),
    kv_type: str = opt.KV_TYPE,
    queue_size: int = typer.Option(
        64, "--queue-size", help="Requests that may wait for a slot, per model; more get 429."
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
    max_memory: str = typer.Option(
        None,
        "--max-memory",
        help="Memory for the loaded models together (e.g. 4G), as `llamacy info` estimates it: weights + "
        "KV cache of --parallel sequences. To load another, the least recently used idle ones are unloaded.",
    ),
    idle_unload: float = typer.Option(
        0.0, "--idle-unload", help="Unload a model unused for this many seconds (0: never)."
    ),
    ray_address: str = typer.Option(
        None,
        "--ray",
        help="Serve on the Ray cluster at this address (its head's host:port, or 'auto'): --replicas copies "
        "of the server behind one ingress at --host/--port, -t threads (CPUs) each. Needs llamacy[ray].",
    ),
    replicas: str = typer.Option(
        "1", "--replicas", help="With --ray: how many replicas, or 'auto' (Serve scales on queue length)."
    ),
    min_replicas: int = typer.Option(None, "--min-replicas", help="With --replicas auto: the fewest (1)."),
    max_replicas: int = typer.Option(None, "--max-replicas", help="With --replicas auto: the most (2)."),
    draft_model: str = typer.Option(
        None,
        "--draft-model",
        help='A smaller model with the same vocabulary that drafts for requests with speculate: "draft" '
        "(greedy answers are those of plain decoding; sampled ones keep their distribution).",
    ),
    context_shift: bool = typer.Option(
        False,
        "--context-shift",
        help="Fit a prompt longer than the context instead of refusing it: a conversation drops its oldest "
        "turns (never the system prompt), a plain prompt keeps its first --keep tokens and its end.",
    ),
    keep: int = typer.Option(
        0,
        "--keep",
        help="With --context-shift: a plain prompt's first tokens to keep (-1: half the context).",
    ),
    slot_save_path: Path = typer.Option(
        None,
        "--slot-save-path",
        help="A directory for POST /slots/{id}?action=save|restore (llama-server's): slots' memory in files.",
    ),
) -> None:
    from llamacy.errors import UsageError, require_range

    if ray_address is not None:
        from llamacy.distributed.cluster import require_ray

        require_ray("serve")  # before any work: without Ray, one line saying how to get it
    elif replicas != "1" or min_replicas is not None or max_replicas is not None:
        raise UsageError("--replicas, --min-replicas and --max-replicas go with --ray")
    if draft_model is not None and (ray_address is not None or len(models or []) > 1 or models_file):
        raise UsageError("--draft-model goes with one model (-m) served here, not several or on Ray")

    opt.check_counts(threads, ctx_size)
    require_range("--port", port, 0, 65535)
    require_range("--parallel", parallel, 1, 256)
    require_range("--queue-size", queue_size, 1)
    require_range("--job-ttl", job_ttl, 0)
    require_range("--keep", keep, -1)
    require_range("--idle-unload", idle_unload, 0)
    budget = parse_size(max_memory) if max_memory is not None else None
    sources = list(models or []) + (read_models_file(models_file) if models_file else [])

    from llamacy.catalog import DEFAULT_MODEL
    from llamacy.cli.info import describe
    from llamacy.model import default_threads
    from llamacy.server import ModelRegistry, ServerSettings, bind, create_app, serve_forever
    from llamacy.server.loading import ModelLoader
    from llamacy.server.models import ModelSpec
    from llamacy.server.runner import url_of

    specs: list[ModelSpec] = []
    ctx_of: list[int] = []  # each model's context per sequence
    for source in sources or [DEFAULT_MODEL]:
        name = model_name(source)
        if any(s.name == name for s in specs):
            raise UsageError(f"two models are named {name!r}: serve each model once, under distinct names")
        # llamacy info's estimate: checks the file now, and sizes the model for --max-memory.
        d = describe(source, ctx_size, kv_type)
        mem = d["memory"]
        ctx_of.append(d["ctx_size"])
        footprint = mem["weights"] + (mem["kv_cache"] + mem["recurrent_state"]) * parallel
        if budget is not None and footprint > budget:
            raise UsageError(
                f"model {name!r} needs about {footprint / 2**20:.0f} MiB (weights + KV cache and state of "
                f"{parallel} sequences) but --max-memory is {budget / 2**20:.0f} MiB"
            )
        specs.append(ModelSpec(name, source, footprint))

    if slot_save_path is not None and not slot_save_path.is_dir():
        raise UsageError(f"--slot-save-path {slot_save_path} is not a directory")
    settings = ServerSettings(
        api_key=api_key or None,
        job_ttl_s=job_ttl,
        slot_save_path=str(slot_save_path) if slot_save_path is not None else None,
        context_shift=context_shift,
        keep=keep,
    )
    if ray_address is not None:
        from llamacy.distributed.ray_serve import ReplicaPlan, serve_on_ray

        plan = ReplicaPlan.parse(replicas, threads or 1, min_replicas, max_replicas)
        loader = ModelLoader(ctx_size, plan.threads, kv_type, parallel, queue_size, chat_template)
        serve_on_ray(ray_address, plan, specs, loader, settings, host, port, budget, idle_unload or None)
        return

    sock = bind(host, port)  # before loading: a port in use fails fast
    loader = ModelLoader(ctx_size, threads, kv_type, parallel, queue_size, chat_template, draft_model)
    registry = ModelRegistry(specs, loader, max_memory=budget, idle_unload_s=idle_unload or None)
    try:
        if len(specs) == 1:
            registry.get(None)  # one model: loaded now, so that a model that cannot load fails here
        app = create_app(registry, settings=settings)
        names = ", ".join(f"{s.name} [{n} tokens]" for s, n in zip(specs, ctx_of, strict=True))
        n_threads = threads or default_threads()
        sys.stderr.write(
            f"llamacy: serving {names} at {url_of(sock)}/v1 ({parallel} parallel, {kv_type} KV cache, "
            f"{n_threads} thread{'s' if n_threads != 1 else ''}{', API key required' if api_key else ''}"
            f"{'; models load on first use' if len(specs) > 1 else ''})\n"
        )
        sys.stderr.flush()
        serve_forever(app, sock)
    except KeyboardInterrupt:
        pass  # uvicorn re-raises Ctrl-C after its graceful shutdown: stopping a server is a success
    finally:
        registry.close()
        sock.close()
