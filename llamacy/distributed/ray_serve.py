"""`llamacy serve --ray`: the same HTTP app, as a Ray Serve application on an existing cluster.

    client ──HTTP──> Serve's proxy (--host/--port, head node only)
                      └─> LlamacyIngress (0 CPUs): reads the body, hashes the prompt's prefix
                           └─ DeploymentHandle, PrefixAffinityRouter ─> LlamacyModel × N (T CPUs each)
                                                                          the whole llamacy app, T threads
    JobBoard (0 CPUs): the replicas' jobs, shared

The ingress forwards every request whole and streams back the replica's ASGI messages; a replica that dies
before answering is tried again elsewhere (not a POST /jobs, which may have started). The command runs in
the foreground and deletes its application (and the job board) on SIGINT or SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray import serve
from ray.serve.config import AutoscalingConfig, RequestRouterConfig

from llamacy.distributed.affinity import prefix_hashes, prompt_text
from llamacy.distributed.cluster import NAMESPACE, cluster_cpus, connect
from llamacy.distributed.job_board import BoardJobs, JobBoard
from llamacy.distributed.tunnel import ForwardedRequest, portable_scope, read_body, run_app
from llamacy.errors import UsageError
from llamacy.server.errors import error_response
from llamacy.server.loading import ModelLoader
from llamacy.server.models import ModelSpec
from llamacy.server.state import ServerSettings

APP_NAME = "llamacy"
BOARD_NAME = "llamacy-jobs"
RETRIES = 2  # more tries of a request whose replica died before answering
log = logging.getLogger("llamacy.distributed")


@dataclass(frozen=True)
class ReplicaPlan:
    """How many model replicas, and how many threads (= CPUs reserved) each."""

    threads: int
    replicas: int | None = None  # a fixed count; None: Serve's autoscaling between min and max
    min_replicas: int = 1
    max_replicas: int = 1

    @classmethod
    def parse(
        cls, text: str, threads: int, min_replicas: int | None, max_replicas: int | None
    ) -> ReplicaPlan:
        if text == "auto":
            lo = 1 if min_replicas is None else min_replicas
            hi = max(lo, 2) if max_replicas is None else max_replicas
            if not 0 <= lo <= hi or hi < 1:
                raise UsageError(
                    f"--min-replicas/--max-replicas need 0 <= min <= max, max >= 1; got {lo}, {hi}"
                )
            return cls(threads, None, lo, hi)
        if not text.isdigit() or int(text) < 1:
            raise UsageError(f"--replicas must be a number of replicas (1 or more) or 'auto', got {text!r}")
        if min_replicas is not None or max_replicas is not None:
            raise UsageError("--min-replicas and --max-replicas go with --replicas auto")
        n = int(text)
        return cls(threads, n, n, n)

    def describe(self) -> str:
        count = (
            str(self.replicas) if self.replicas else f"{self.min_replicas}-{self.max_replicas} (autoscaled)"
        )
        return f"{count} replicas x {self.threads} thread{'s' if self.threads != 1 else ''}"


# ---- inside the cluster --------------------------------------------------------------------------------


class LlamacyModel:
    """One replica: the models, their schedulers and the whole llamacy app, run on forwarded requests."""

    def __init__(
        self,
        specs: list[ModelSpec],
        loader: ModelLoader,
        settings: ServerSettings,
        max_memory: int | None = None,
        idle_unload_s: float | None = None,
    ) -> None:
        from llamacy.server import ModelRegistry, create_app

        _bind_internal_grpc_to_node_address()
        # Serve's replica id, the machine, the process: what an operator needs to find it.
        replica_id = serve.get_replica_context().replica_id.unique_id
        self.name = f"{replica_id}@{ray.util.get_node_ip_address()}/{os.getpid()}"
        self.registry = ModelRegistry(specs, loader, max_memory=max_memory, idle_unload_s=idle_unload_s)
        if len(specs) == 1:
            self.registry.get(None)  # loaded now: a model that cannot load fails the deployment, visibly
        board = ray.get_actor(BOARD_NAME, namespace=NAMESPACE)
        ray.get(board.register.remote(self.name, ray.get_runtime_context().current_actor))
        self.app = create_app(
            self.registry,
            settings=replace(settings, replica_name=self.name),
            shared_jobs=BoardJobs(board, self.name),
        )

    async def handle(self, request: ForwardedRequest) -> Any:
        async for messages in run_app(self.app, request):
            yield messages

    def check_health(self) -> None:
        """Serve's periodic probe: a crashed scheduler makes Serve replace this replica."""
        dead = [m.name for m in self.registry.loaded() if not m.scheduler.alive]
        if dead:
            raise RuntimeError(f"the scheduler of {', '.join(dead)} stopped")

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.registry.close()


class LlamacyIngress:
    """The HTTP entry: each request, read whole, goes to a model replica chosen by its prompt's prefix."""

    def __init__(self, model: Any, max_body: int) -> None:
        _bind_internal_grpc_to_node_address()
        self.model = model.options(method_name="handle", stream=True)
        self.max_body = max_body
        self.name = f"ingress-{serve.get_replica_context().replica_id.unique_id}"

    def __serve_build_asgi_app__(self) -> Any:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await self.asgi(scope, receive, send)  # a coroutine function: uvicorn then speaks ASGI 3

        return app

    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive, self.max_body + 1)
        prefix = prefix_hashes(prompt_text(body)) if scope["method"] == "POST" else ()
        request = ForwardedRequest(portable_scope(scope), body, prefix)
        may_retry = not (scope["method"] == "POST" and scope["path"].rstrip("/") == "/jobs")
        for _ in range(1 + (RETRIES if may_retry else 0)):
            responses = self.model.remote(request)
            started = finished = False
            try:
                async for messages in responses:
                    for message in messages:
                        started = True
                        await send(message)
                finished = True
                return
            except ray.exceptions.RayActorError:
                if started:
                    return  # the stream is cut; the client sees it end early
                log.warning("a replica stopped before answering %s %s", scope["method"], scope["path"])
            except Exception:
                if started:
                    raise
                log.exception("%s %s", scope["method"], scope["path"])
                await self._error(scope, receive, send, 500, "the replica failed to answer (see its log)")
                return
            finally:
                if not finished:
                    responses.cancel()  # the client went away, or the replica did
        await self._error(scope, receive, send, 503, "the replica serving this request stopped; retry")

    async def _error(self, scope: Any, receive: Any, send: Any, status: int, message: str) -> None:
        kind = "replica_unavailable" if status == 503 else "internal_error"
        resp = error_response(status, message, kind, headers={"Retry-After": "1"} if status == 503 else None)
        resp.headers["X-Llamacy-Replica"] = self.name
        await resp(scope, receive, send)


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _bind_internal_grpc_to_node_address() -> None:
    """Ray Serve 2.60 starts, in every replica, an inter-deployment gRPC server (used only when
    RAY_SERVE_USE_GRPC_BY_DEFAULT=1) on "[::]:0": every interface, whatever --node-ip-address the node
    was given. Bind it to the node's address instead, where Ray reaches it; runs before Serve starts it."""
    import ray.serve._private.replica as replica_module

    original = getattr(replica_module, "add_port_to_grpc_server", None)
    if original is None or getattr(original, "_llamacy", False):
        return
    node = ray.util.get_node_ip_address()

    def add_port(server: Any, address: str) -> int:
        if address.startswith("[::]:"):
            address = (f"[{node}]" if ":" in node else node) + address[4:]
        return original(server, address)

    add_port._llamacy = True  # type: ignore[attr-defined]
    replica_module.add_port_to_grpc_server = add_port


# ---- the foreground command ----------------------------------------------------------------------------


def serve_on_ray(
    address: str,
    plan: ReplicaPlan,
    specs: list[ModelSpec],
    loader: ModelLoader,
    settings: ServerSettings,
    host: str,
    port: int,
    max_memory: int | None = None,
    idle_unload_s: float | None = None,
) -> None:
    """Deploy, print where it answers, wait for SIGINT/SIGTERM, delete the deployment. `max_memory` and
    `idle_unload_s` apply to each replica, as to a local server."""
    if port == 0:
        raise UsageError("--port 0 is not supported with --ray: Serve's proxy needs a fixed port")
    _check_port_free(host, port)
    connect(address)
    stop = _stop_on_signals()  # now: Ray's driver has just installed its own SIGTERM handler
    try:
        cpus = cluster_cpus()
        need = plan.min_replicas * plan.threads
        if need > cpus:
            raise UsageError(
                f"{plan.describe()} need {need} CPUs, and the Ray cluster at {address} has {cpus}: "
                "use fewer replicas or threads, or add machines"
            )
        _deploy(plan, (specs, loader, settings, max_memory, idle_unload_s), host, port)
        try:
            url = f"http://{_url_host(host)}:{port}"
            sys.stderr.write(
                f"llamacy: serving {', '.join(s.name for s in specs)} at {url}/v1 on the Ray cluster at "
                f"{address} ({plan.describe()}, {loader.n_parallel} parallel each; Ctrl-C removes it)\n"
            )
            sys.stderr.flush()
            while not stop.wait(0.5):
                pass
        finally:
            _undeploy()
    finally:
        ray.shutdown()


def _deploy(plan: ReplicaPlan, replica_args: tuple, host: str, port: int) -> None:
    """Start Serve (if it is not), the job board and the application; return once every replica is up.
    `replica_args`: LlamacyModel's (specs, loader, settings, max_memory, idle_unload_s)."""
    loader: ModelLoader = replica_args[1]
    settings: ServerSettings = replica_args[2]
    serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly")
    JobBoard.options(name=BOARD_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True).remote(
        settings.job_ttl_s, settings.max_finished_jobs
    )
    model = serve.deployment(LlamacyModel).options(**model_options(plan, loader.n_parallel))
    ingress = serve.deployment(serve.ingress()(LlamacyIngress)).options(
        name="LlamacyIngress", num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000
    )
    try:
        serve.run(
            ingress.bind(model.bind(*replica_args), settings.max_body_bytes),
            name=APP_NAME,
            route_prefix="/",
        )
    except RuntimeError as e:
        _undeploy()
        first = str(e).strip().splitlines()[0] if str(e).strip() else "see the replicas' logs"
        raise UsageError(f"the deployment failed: {first}") from None


def model_options(plan: ReplicaPlan, parallel: int) -> dict[str, Any]:
    """The model deployment's Serve options."""
    scaling: dict[str, Any] = {"num_replicas": plan.replicas}
    if plan.replicas is None:
        scaling = {
            "num_replicas": "auto",
            "autoscaling_config": AutoscalingConfig(
                min_replicas=plan.min_replicas,
                max_replicas=plan.max_replicas,
                target_ongoing_requests=parallel,  # one replica's slots, busy
            ),
        }
    return {
        "name": "LlamacyModel",
        "ray_actor_options": {"num_cpus": plan.threads},  # Ray places no more replicas than cores
        # A replica holds its slots' worth and as many waiting; beyond that requests wait in the router,
        # for whichever replica frees a slot first.
        "max_ongoing_requests": 2 * parallel,
        "request_router_config": RequestRouterConfig(
            request_router_class="llamacy.distributed.router.PrefixAffinityRouter",
            request_router_kwargs={"imbalance": parallel},
        ),
        "health_check_period_s": 2,
        "graceful_shutdown_timeout_s": 5,
        **scaling,
    }


def _undeploy() -> None:
    with contextlib.suppress(Exception):
        serve.delete(APP_NAME)
    with contextlib.suppress(Exception):
        ray.kill(ray.get_actor(BOARD_NAME, namespace=NAMESPACE))
    with contextlib.suppress(Exception):
        if not serve.status().applications:
            serve.shutdown()  # ours was the only application: the proxy lets go of the port too


def _stop_on_signals() -> threading.Event:
    """An event that SIGINT or SIGTERM sets (one that comes while deploying ends the command once the
    deployment is up, and removed)."""
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    return stop


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host
