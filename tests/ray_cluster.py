"""A private Ray cluster for the tests: one node on 127.0.0.1 with its own ports, temp dir and token, and a
check that none of its processes listens on, or talks to, any other address.

    with LocalRayCluster(num_cpus=2) as cluster:
        subprocess.run([..., "--ray", cluster.address], env=cluster.env)
        assert cluster.foreign_sockets() == []

Its processes are found by a marker in their environment (every process of the cluster, and every
command run with cluster.env, inherits it), and are stopped by their ids on exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAY = [sys.executable, "-m", "ray.scripts.scripts"]


def free_ports(n: int) -> list[int]:
    """n distinct free ports. Every socket stays bound until all are: asked one at a time, the OS may hand
    the same port out twice (node_manager and dashboard_agent_http both got 50067 once, and Ray refused to
    start)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _free_range(n: int) -> int:
    """The first of n consecutive free ports (worker processes take theirs from this range)."""
    for _ in range(200):
        base = random.randrange(20000, 30000 - n)
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


class LocalRayCluster:
    def __init__(self, num_cpus: int = 2, start_timeout: float = 120.0) -> None:
        self.num_cpus = num_cpus
        self.start_timeout = start_timeout
        self.marker = secrets.token_hex(8)
        self.tmp = Path(tempfile.mkdtemp(prefix="lr", dir="/tmp"))  # short: Ray puts unix sockets under it
        # The GCS port, then the node's components' (start), all distinct.
        self.port, *self._ports = free_ports(8)
        self.address = f"127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "LLAMACY_RAY_TEST_CLUSTER": self.marker,
            # Its own token: Ray turns token authentication on and would read (or write) ~/.ray/auth_token.
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "RAY_USAGE_STATS_ENABLED": "0",
            # Without it, Ray may swap 127.0.0.1 for the machine's interface address.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "HOME": str(self.tmp),
        }
        self.proc: subprocess.Popen | None = None

    def start(self) -> LocalRayCluster:
        workers = _free_range(100)
        p = self._ports
        cmd = [
            *RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
            "--port", str(self.port), "--num-cpus", str(self.num_cpus), "--include-dashboard=false",
            "--disable-usage-stats", "--temp-dir", str(self.tmp / "t"),
            "--node-manager-port", str(p[0]), "--object-manager-port", str(p[1]),
            "--ray-client-server-port", str(p[2]),
            "--dashboard-agent-listen-port", str(p[3]), "--dashboard-agent-grpc-port", str(p[4]),
            "--runtime-env-agent-port", str(p[5]), "--metrics-export-port", str(p[6]),
            "--min-worker-port", str(workers), "--max-worker-port", str(workers + 99),
            "--object-store-memory", str(200 << 20),
        ]  # fmt: skip
        log = open(self.tmp / "ray-start.log", "wb")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while b"Ray runtime started" not in (self.tmp / "ray-start.log").read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out = (self.tmp / "ray-start.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"the test Ray cluster did not start:\n{out}")
            time.sleep(0.2)
        return self

    def pids(self) -> list[int]:
        """Every process carrying the marker: the cluster's, and commands run with self.env."""
        mark = f"LLAMACY_RAY_TEST_CLUSTER={self.marker}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if mark in (entry / "environ").read_bytes().split(b"\0"):
                        found.append(int(entry.name))
                except OSError:
                    pass
        return found

    def foreign_sockets(self) -> list[str]:
        """Sockets of the cluster's processes that listen on, or connect to, an address other than
        127.0.0.1: each as 'pid (name): description'. Empty when all is well."""
        tables = _socket_tables()
        bad = []
        for pid in self.pids():
            try:
                fds = list(Path(f"/proc/{pid}/fd").iterdir())
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    info = tables.get(target[8:-1])
                    if info is not None and not _loopback_only(*info):
                        bad.append(f"{pid} ({name}): {info[0]} {info[1]} local {info[2]} remote {info[3]}")
        return bad

    def stop(self) -> None:
        """Stop every process of the cluster, by id: SIGTERM to all at once, SIGKILL to those left."""
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.1)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)  # reaped: no zombie left behind
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- /proc/net ------------------------------------------------------------------------------------------

_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "0A": "LISTEN", "06": "TIME_WAIT", "08": "CLOSE_WAIT"}


def _socket_tables() -> dict[str, tuple[str, str, str, str]]:
    """inode -> (protocol, state, local address, remote address), from this network namespace."""
    out = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, remote, state, inode = f[1], f[2], f[3], f[9]
            out[inode] = (proto, _TCP_STATES.get(state, state), _addr(local), _addr(remote))
    return out


def _addr(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, raw[::-1])}:{int(port, 16)}"
    # IPv6: four 32-bit words, each in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return f"[{socket.inet_ntop(socket.AF_INET6, words)}]:{int(port, 16)}"


def _is_loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host == "::1" or host.startswith("::ffff:127.")


def _unset(addr: str) -> bool:
    host, port = addr.rsplit(":", 1)
    return port == "0" and host.strip("[]") in ("0.0.0.0", "::")


def _loopback_only(proto: str, state: str, local: str, remote: str) -> bool:
    if state == "LISTEN" or proto.startswith("udp"):
        return _is_loopback(local) and (_unset(remote) or _is_loopback(remote))
    if _unset(local):
        return True  # a socket not yet bound
    return _is_loopback(local) and (_unset(remote) or _is_loopback(remote))
