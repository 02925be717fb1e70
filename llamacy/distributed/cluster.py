"""Importing Ray (an optional extra) and connecting to a cluster, each failure a one-line error."""

from __future__ import annotations

import logging

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


def cluster_cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 0))
