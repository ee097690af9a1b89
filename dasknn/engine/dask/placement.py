"""Which worker does what: the FC server, the conv model server, the compute groups, the shares.

Omnivore §III-B / appendix C: the merged FC server sits on one machine (resource `FC` if a worker
offers it, else a GPU worker, else the first); the conv model server sits on a conv machine; the N
conv workers form g groups of k = N // g workers. Inside a group each worker gets a share of the
batch in proportion to its throughput (Caffe con Troll §2.3: FLOPS-proportional): the SGEMM
GFLOP/s of `DaskEngine.calibrate()` or given by hand; equal shares without either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any


@dataclass
class Placement:
    """The physical map of one run."""

    fc_worker: str
    conv_server_worker: str
    groups: list[list[str]]
    shares: dict[str, float]
    devices: dict[str, str] = field(default_factory=dict)
    oversubscribed: bool = False

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    @property
    def conv_workers(self) -> list[str]:
        return sorted({w for g in self.groups for w in g})

    def roles(self) -> dict[str, list[str]]:
        """worker → what it does, for reports and error messages."""
        out: dict[str, list[str]] = {}
        out.setdefault(self.fc_worker, []).append("FC server")
        out.setdefault(self.conv_server_worker, []).append("conv model server")
        for i, group in enumerate(self.groups):
            for w in group:
                out.setdefault(w, []).append(f"conv group {i}")
        return out


def _has(info: Mapping[str, Any], resource: str) -> bool:
    return float(info.get("resources", {}).get(resource, 0)) > 0


def device_of(info: Mapping[str, Any]) -> str:
    """'gpu' for a worker started with `--resources GPU=1`, else 'cpu'."""
    return "gpu" if _has(info, "GPU") else "cpu"


def _host(address: str) -> str:
    return address.split("://", 1)[-1].rsplit(":", 1)[0]


def worker_devices(workers: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """address → 'cpu' or 'gpu:N', N the worker's index among the GPU workers of its host.

    Several `GPU=1` workers on one multi-GPU host so use different GPUs (`backend.device_scope`
    takes N modulo the GPUs a worker sees; one whose CUDA_VISIBLE_DEVICES names a single GPU uses
    that one)."""
    out, per_host = {}, {}
    for a in sorted(workers):
        if device_of(workers[a]) == "gpu":
            i = per_host[_host(a)] = per_host.get(_host(a), -1) + 1
            out[a] = f"gpu:{i}"
        else:
            out[a] = "cpu"
    return out


def plan(
    workers: Mapping[str, Mapping[str, Any]],
    n_groups: int,
    throughput: Mapping[str, float] | None = None,
) -> Placement:
    """The placement for `n_groups` groups over `workers` (address → scheduler info with resources).

    A worker with resource `FC` hosts the FC server and no conv work (as the paper's dedicated FC
    machine) when other workers remain for conv; otherwise the FC server shares a conv worker.
    With more groups than conv workers each group gets one worker and groups share workers
    (`oversubscribed`): they interleave, which keeps asynchrony real on a small machine.
    """
    if not workers:
        raise RuntimeError("the cluster has no workers; start some with `dask worker <scheduler-address>`")
    n_groups = int(n_groups)
    if n_groups < 1:
        raise ValueError(f"n_groups must be >= 1, got {n_groups}")
    addrs = sorted(workers)
    fc_candidates = [a for a in addrs if _has(workers[a], "FC")]
    gpu = [a for a in addrs if _has(workers[a], "GPU")]
    fc_worker = (fc_candidates or gpu or addrs)[0]
    conv = [a for a in addrs if a != fc_worker] if fc_candidates and len(addrs) > 1 else list(addrs)
    n_conv = len(conv)
    if n_groups <= n_conv:
        k = n_conv // n_groups
        groups = [conv[i * k : (i + 1) * k] for i in range(n_groups)]
        oversubscribed = False
    else:
        groups = [[conv[i % n_conv]] for i in range(n_groups)]
        oversubscribed = True
    rate = {a: float((throughput or {}).get(a, 1.0)) for a in conv}
    if any(not r > 0 for r in rate.values()):
        raise ValueError(f"throughputs must be > 0, got {rate}")
    shares: dict[str, float] = {}
    for group in groups:
        total = sum(rate[w] for w in group)
        for w in group:
            shares[w] = rate[w] / total
    return Placement(
        fc_worker=fc_worker,
        conv_server_worker=groups[0][0],
        groups=groups,
        shares=shares,
        devices=worker_devices(workers),
        oversubscribed=oversubscribed,
    )


def replan(
    workers: Mapping[str, Mapping[str, Any]],
    previous: Placement,
    throughput: Mapping[str, float] | None = None,
) -> Placement:
    """The placement after a failure, on the `workers` that remain.

    Keeps `previous.n_groups` when enough conv workers remain for one each (or when the previous
    plan already had groups share workers); otherwise one group per remaining conv worker, so a
    lost machine means fewer groups rather than groups that share a worker.
    """
    if not workers:
        raise RuntimeError("no workers remain in the cluster")
    if throughput:  # a worker that joined since the calibration counts as a typical one
        known = [float(throughput[a]) for a in workers if a in throughput]
        typical = median(known) if known else 1.0
        throughput = {a: float(throughput.get(a, typical)) for a in workers}
    n_conv = len(plan(workers, 1, throughput).groups[0])
    n_groups = previous.n_groups if previous.oversubscribed else min(previous.n_groups, n_conv)
    return plan(workers, n_groups, throughput)


def shard_sizes(batch_size: int, shares: Sequence[float]) -> list[int]:
    """Split a batch into integer shards proportional to `shares` (largest remainder), each >= 1."""
    k = len(shares)
    if batch_size < k:
        raise ValueError(f"batch of {batch_size} cannot be split over {k} workers")
    total = float(sum(shares))
    exact = [batch_size * s / total for s in shares]
    sizes = [max(1, int(e)) for e in exact]
    order = sorted(range(k), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    i = 0
    while sum(sizes) < batch_size:
        sizes[order[i % k]] += 1
        i += 1
    while sum(sizes) > batch_size:
        j = max(range(k), key=lambda t: sizes[t])
        sizes[j] -= 1
    return sizes
