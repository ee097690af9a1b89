"""A Dask cluster whose workers each have their own network link: namespaces, veth pairs and `tc`.

FireCaffe's Eq. 3/4 assume every node talks through its own link of bandwidth BW, so that a
parameter server's k − 1 incoming gradients queue on its one link. On one machine, localhost has
no such link; this module makes them. Each worker runs in its own network namespace, joined to a
bridge in the calling namespace by a veth pair whose two ends are shaped by a token bucket
(`tc qdisc ... tbf`) at `rate_mbit`: one link per worker, BW up and BW down. The scheduler and the
client stay in the calling namespace, on the bridge's address.

It needs root (CAP_NET_ADMIN) and iproute2 (`ip`, `tc`); `unavailable()` says why not where they
are missing. Every device and namespace it creates carries a name with this process's id, and all
of them are removed on leaving the context, also when starting the cluster fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["MAX_WORKERS", "SUBNET", "Links", "netns_client", "unavailable"]

SUBNET = "10.213.{}.{}"
"""The private subnet of the links (10.213.X.0/24, X from the process id); the bridge is .1."""

MAX_WORKERS = 16
"""Workers (namespaces) one cluster may have: a bound on what the experiment creates."""

NO_WORKER_TTL = {"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "None"}
"""The scheduler never drops a worker for missed heartbeats: on a shared machine whose processes
are paused for minutes at a time (SIGSTOP), a worker that resumes a moment after the scheduler
is otherwise removed with the gradients it holds, and the sum being timed is lost."""

START_TIMEOUT = 240.0
"""Seconds to wait for the scheduler's address, and again for every worker to register (a loaded
2-core machine takes a minute or more to start eight Python processes)."""


def unavailable() -> str | None:
    """Why namespaced links cannot be made here (not root, no `ip` or `tc`), or None if they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) to create network namespaces and veth links"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"needs iproute2 ({', '.join(missing)} not found)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30)


def _shape(dev: str, rate_mbit: float, netns: str | None = None, verb: str = "add") -> None:
    """A token bucket of `rate_mbit` on `dev`'s egress (a queue of up to 16 MB: no drops in a sum);
    `verb` "change" sets the rate of the one already there."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    _ip(
        *prefix,
        "tc", "qdisc", verb, "dev", dev, "root", "tbf",
        "rate", f"{rate_mbit}mbit", "burst", "256kb", "limit", "16mb",
    )  # fmt: skip


class Links:
    """The bridge, the k namespaces and their veth pairs; `remove()` undoes whatever was made."""

    def __init__(self, n_workers: int, rate_mbit: float) -> None:
        tag = os.getpid() % 100_000
        self.bridge = f"dnb{tag}"
        self.subnet = (os.getpid() % 200) + 20
        self.namespaces: list[str] = []
        self.hosts: list[str] = []
        self.bridge_ip = SUBNET.format(self.subnet, 1)
        self._tag, self._rate = tag, rate_mbit
        self._n = n_workers

    def create(self) -> None:
        _ip("ip", "link", "add", self.bridge, "type", "bridge")
        _ip("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _ip("ip", "link", "set", self.bridge, "up")
        for i in range(self._n):
            ns, outer, inner = f"dnn{self._tag}w{i}", f"dnv{self._tag}w{i}", f"dnp{self._tag}w{i}"
            host = SUBNET.format(self.subnet, i + 2)
            _ip("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            _ip("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("ip", "link", "set", inner, "netns", ns)
            _ip("ip", "link", "set", outer, "master", self.bridge)
            _ip("ip", "link", "set", outer, "up")
            _ip("ip", "netns", "exec", ns, "ip", "addr", "add", f"{host}/24", "dev", inner)
            _ip("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            _ip("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            _shape(outer, self._rate)  # toward the worker: its downlink
            _shape(inner, self._rate, netns=ns)  # from the worker: its uplink
            self.hosts.append(host)

    def set_rate(self, rate_mbit: float) -> None:
        """Shape every link, both ways, to `rate_mbit` (the cluster keeps running)."""
        if not float(rate_mbit) > 0:
            raise ValueError(f"rate_mbit must be > 0, got {rate_mbit}")
        for i, ns in enumerate(self.namespaces):
            _shape(f"dnv{self._tag}w{i}", rate_mbit, verb="change")
            _shape(f"dnp{self._tag}w{i}", rate_mbit, netns=ns, verb="change")
        self._rate = float(rate_mbit)

    def remove(self) -> None:
        """Delete the namespaces (their veth pairs go with them) and the bridge; never raises."""
        for ns in self.namespaces:
            _ip("ip", "netns", "delete", ns, check=False)
        _ip("ip", "link", "delete", self.bridge, check=False)
        self.namespaces = []


def _stop(processes: list[subprocess.Popen]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in processes:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _scheduler_address(proc: subprocess.Popen, path: Path, deadline: float) -> str:
    """Wait for the scheduler's file to say where it listens."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the dask scheduler exited with code {proc.returncode} before listening")
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            return json.loads(path.read_text())["address"]
        time.sleep(0.1)
    raise TimeoutError(f"the dask scheduler did not listen within {START_TIMEOUT:.0f} s")


@contextlib.contextmanager
def netns_client(n_workers: int, rate_mbit: float) -> Iterator[tuple]:
    """(Client, Links) of `n_workers` one-thread workers, each behind its own `rate_mbit` link.

    Worker i listens on the bridge's subnet at host .i+2, so sorting the workers' addresses gives
    them in namespace order; `Links.set_rate` reshapes every link while the cluster runs.

    Raises RuntimeError with the reason where namespaces cannot be made (`unavailable()`), and
    ValueError for a worker count outside [1, MAX_WORKERS] or a rate that is not positive.
    """

    if not 1 <= int(n_workers) <= MAX_WORKERS:
        raise ValueError(f"n_workers must be in [1, {MAX_WORKERS}], got {n_workers}")
    if not float(rate_mbit) > 0:
        raise ValueError(f"rate_mbit must be > 0, got {rate_mbit}")
    reason = unavailable()
    if reason:
        raise RuntimeError(f"per-worker links: {reason}")
    links, processes = Links(int(n_workers), float(rate_mbit)), []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **NO_WORKER_TTL}
    with tempfile.TemporaryDirectory(prefix="dasknn-netns-") as tmp:
        try:
            links.create()
            yield from _cluster(links, processes, Path(tmp) / "scheduler.json", env, int(n_workers))
        finally:
            _stop(processes[1:])
            _stop(processes[:1])
            links.remove()


def _cluster(links: Links, processes: list, scheduler_file: Path, env: dict, n_workers: int) -> Iterator:
    """Start the scheduler and one worker per namespace (into `processes`); yield a Client of them."""
    from distributed import Client

    deadline = time.monotonic() + START_TIMEOUT
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", links.bridge_ip,
         "--port", "0", "--no-dashboard", "--scheduler-file", str(scheduler_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    processes.append(scheduler)
    address = _scheduler_address(scheduler, scheduler_file, deadline)
    for ns, host in zip(links.namespaces, links.hosts, strict=True):
        processes.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    address,
                    "--host",
                    host,
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--no-dashboard",
                    "--name",
                    ns,
                    "--memory-limit",
                    "0",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )  # fmt: skip
        )
    with Client(address, timeout=START_TIMEOUT) as client:
        client.wait_for_workers(n_workers, timeout=START_TIMEOUT)
        yield client, links
