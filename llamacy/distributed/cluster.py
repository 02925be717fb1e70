"""Importing Ray (an optional extra) and connecting to a cluster, each failure a one-line error."""

from __future__ import annotations

import logging
import socket

from llamacy.errors import UsageError

NAMESPACE = "llamacy"  # the Ray namespace of everything llamacy starts on a cluster
INSTALL_HINT = "--ray needs Ray, an optional extra: pip install 'llamacy[ray]'"


def require_ray(part: str) -> None:
    """Raise a UsageError saying how to install Ray unless `ray` and its `part` (serve, data) import."""
    try:
        __import__(f"ray.{part}")
    except ImportError:
        raise UsageError(INSTALL_HINT) from None


def connect(address: str) -> None:
    """Join the cluster at `address` (host:port of its head, or "auto") as a driver, quietly: Ray's own
    INFO lines would fill a terminal (and a pipe must stay silent)."""
    import ray

    _check_reachable(address)
    for name in ("ray", "ray.serve", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            logging_level=logging.WARNING,
            log_to_driver=False,
            include_dashboard=False,
        )
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot join the Ray cluster at {address}: {first}") from None


def _check_reachable(address: str) -> None:
    """A head that does not answer is one line now; ray.init would retry for minutes, logging as it goes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise UsageError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def cluster_cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 0))
