"""Hardware efficiency: Omnivore's time-per-iteration model and FireCaffe's communication models.

Omnivore §IV-B and appendix D-D (Hardware Efficiency Model): N conv devices form g compute groups of
k = N/g devices sharing one merged FC server that serves one batch at a time, so

    t_conv(k) = max(T_cc / k, T_nc · k)          (compute shrinks with k, network grows with k)
    HE(g)     = max{t_fc, (t_conv(k) + t_fc) / g}  (predicted time per iteration)

and the FC server is saturated when t_conv(k) + t_fc < g · t_fc. An engine also pays a fixed cost
per round trip between two processes (messages, serialisation, thread hops), which neither T_nc's
bytes nor the compute times hold: `t_call`, times the round trips of one group's iteration
(`HEModel.round_trips`), added to each group's iteration; a remote shard's call carries its
images, the weights and the activations, and costs `t_shard_call`. Part of a device's conv time
per batch does not shrink with its shard (each layer's kernel calls, lowering set-up and Python
per call): `t_conv_fixed`, so that T_cc / k becomes (T_cc − t_conv_fixed) / k + t_conv_fixed.
Where the processes outnumber the cores they share (workers, servers, driver, scheduler), the
iterations are also bound by the CPU work they need: `cores`, `cpu_call` and `cpu_background`
(see `HEModel.t_cpu`). Where the merged FC server shares a process with groups' leads (the Dask
engine puts it on group 0's lead, where Omnivore gives it a machine of its own), that process's
share of an iteration is `HEModel.t_servers` in place of t_fc. FireCaffe §6 (Iandola et al.)
gives the gradient-communication time of a parameter server and of a reduction tree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

__all__ = [
    "HEModel",
    "phase_costs",
    "t_parameter_server",
    "t_reduction_tree",
    "time_per_iteration",
]

CONV_EFFICIENCY = 0.5
"""Fraction of device peak that conv layers reach with batched lowering (Omnivore §III-A, Fig. 3)."""

FWD_BWD_FACTOR = 3
"""FLOPs of forward + backward over forward alone: backward costs about twice the forward."""


def phase_costs(net, batch_size: int) -> dict[str, float]:
    """FLOPs (forward + backward) and bytes of the conv and FC phases for one batch (Omnivore §II-B).

    From `net.summary()`: forward FLOPs ×3 for forward + backward; `conv_model_bytes` and
    `fc_model_bytes` are parameter bytes; `split_activation_bytes` is what crosses from the conv
    phase to the FC server for the whole batch (the same again travels back as its gradient): on a
    graph, every blob that crosses the split (the main path's and the auxiliary heads').
    """
    s = net.summary()
    conv, fc = s[s["phase"] == "conv"], s[s["phase"] == "fc"]
    b = int(batch_size)
    return {
        "conv_flops": float(FWD_BWD_FACTOR * conv["flops"].sum() * b),
        "fc_flops": float(FWD_BWD_FACTOR * fc["flops"].sum() * b),
        "conv_model_bytes": float(conv["param_bytes"].sum()),
        "fc_model_bytes": float(fc["param_bytes"].sum()),
        "split_activation_bytes": float(conv.loc[conv["to_fc"], "activation_bytes"].sum() * b),
    }


@dataclass(frozen=True)
class HEModel:
    """Omnivore's hardware efficiency model: predicted time per iteration for g groups (§IV-B).

    T_cc: conv-phase forward + backward time of one batch on one device (s);
    T_nc: network time of one copy of the conv model out and its gradient back (s);
    t_fc: FC-phase time for one batch, activations in and their gradients out included (s);
    n_workers: N, the conv devices; g groups get k = N // g each (any remainder sits idle);
    t_call: the fixed cost of one round trip between two processes, its bytes aside (s; 0: the
    paper's model);
    local_groups: how many groups' leads share the servers' process, so that their pull, FC step
    and push are calls in that process (the Dask engine places the servers on group 0's lead: 1);
    cores: the CPU cores all the run's processes share (0: as many as they need, the paper's model);
    cpu_call: the CPU time one round trip costs all processes together (s: serialisation, both
    event loops, thread hops);
    cpu_background: the CPU the processes spend per second whatever the iterations do (s/s: the
    cluster's event loops, heartbeats and monitors);
    cpu_work: the CPU time of one batch's conv and FC compute (s; 0: T_cc + t_fc, which is their
    CPU time where single-threaded kernels ran on an idle core);
    t_conv_fixed: the part of T_cc a device pays per batch whatever its shard's size (s; 0: the
    paper's T_cc / k);
    t_shard_call: one round trip of a remote shard's forward or backward call with the bytes it
    carries (s; 0: `t_call`).

    With t_call = 0 every group's iteration takes t_conv(k) + t_fc and HE(g) is Omnivore's. Else
    group i's takes t_i = t_conv(k) + t_fc + round_trips(k, local) · t_call, the g groups together
    complete 1 / Σ 1/t_i iterations per second, and HE(g) = max{t_servers(g), 1 / Σ_i 1/t_i,
    t_cpu(g)} (t_cpu = 0 when cores = 0; t_servers = t_fc when no lead shares the servers' process).
    """

    T_cc: float
    T_nc: float
    t_fc: float
    n_workers: int
    t_call: float = 0.0
    local_groups: int = 0
    cores: float = 0.0
    cpu_call: float = 0.0
    cpu_background: float = 0.0
    cpu_work: float = 0.0
    t_conv_fixed: float = 0.0
    t_shard_call: float = 0.0

    def __post_init__(self) -> None:
        if int(self.local_groups) < 0:
            raise ValueError(f"local_groups must be >= 0, got {self.local_groups}")
        for key in (f.name for f in fields(self) if f.type == "float"):  # every time and CPU term
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{key} must be a finite number >= 0, got {value}")
        if self.t_conv_fixed > self.T_cc:
            raise ValueError(f"t_conv_fixed ({self.t_conv_fixed}) cannot exceed T_cc ({self.T_cc})")
        if int(self.n_workers) < 1:
            raise ValueError(f"n_workers must be >= 1, got {self.n_workers}")
        if self.cores and self.cpu_background >= self.cores:
            raise ValueError(
                f"cpu_background ({self.cpu_background}) must be below cores ({self.cores}): "
                "no CPU would be left for the iterations"
            )

    # -- constructors ----------------------------------------------------------------------------
    @classmethod
    def from_measurements(
        cls,
        t_conv_1: float,
        t_fc: float,
        n_workers: int,
        conv_model_bytes: float,
        bandwidth_bytes_per_s: float,
        **terms: float,
    ) -> HEModel:
        """The model from calibration: measured t_conv(1) and t_fc, conv model bytes, network speed,
        and any other measured term of the class by its name (`t_call`, `local_groups`, the CPU
        terms, `t_conv_fixed`, `t_shard_call`).

        Omnivore appendix D-D: T_cc = t_conv(1) (one device is compute-bound), and
        T_nc = 2 · conv_model_bytes / bandwidth: the conv model server sends the model to each
        worker of a group and receives a gradient of the same size from each, so with k workers
        that traffic is k times T_nc.
        """
        _positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")
        types = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(terms) - set(types))
        if unknown:
            raise TypeError(f"HEModel has no term {unknown[0]!r}")
        return cls(
            T_cc=float(t_conv_1),
            T_nc=2.0 * float(conv_model_bytes) / float(bandwidth_bytes_per_s),
            t_fc=float(t_fc),
            n_workers=int(n_workers),
            **{k: int(v) if types[k] == "int" else float(v) for k, v in terms.items()},
        )

    @classmethod
    def estimate(
        cls,
        net,
        batch_size: int,
        n_workers: int,
        device_gflops: float,
        bandwidth_bytes_per_s: float,
        fc_gflops: float | None = None,
        efficiency: float = CONV_EFFICIENCY,
    ) -> HEModel:
        """The model from FLOP and byte counts at device and network speeds (Omnivore appendix D-D).

        T_cc = conv FLOPs (forward ×3) / (device_gflops · efficiency); t_fc = FC FLOPs / (fc_gflops ·
        efficiency) plus the split activations to the FC server and their gradients back at
        `bandwidth_bytes_per_s`; T_nc = 2 · conv model bytes / bandwidth (the conv model server sends
        the model to, and receives a gradient from, each of the k workers of a group). `efficiency`
        is the fraction of peak reached (default 0.5, Omnivore Fig. 3: conv layers at ~50% of peak).
        """
        _positive(device_gflops, "device_gflops")
        _positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")
        if not 0 < efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
        fc_gflops = device_gflops if fc_gflops is None else fc_gflops
        _positive(fc_gflops, "fc_gflops")
        c = phase_costs(net, batch_size)
        T_cc = c["conv_flops"] / (device_gflops * 1e9 * efficiency)
        t_fc = (
            c["fc_flops"] / (fc_gflops * 1e9 * efficiency)
            + 2.0 * c["split_activation_bytes"] / bandwidth_bytes_per_s
        )
        T_nc = 2.0 * c["conv_model_bytes"] / bandwidth_bytes_per_s
        return cls(T_cc=T_cc, T_nc=T_nc, t_fc=t_fc, n_workers=int(n_workers))

    # -- the model -------------------------------------------------------------------------------
    def group_size(self, g: int) -> int:
        """k = N // g, the devices per group (Omnivore §IV-B)."""
        g = int(g)
        if not 1 <= g <= self.n_workers:
            raise ValueError(f"n_groups must be in [1, {self.n_workers}] (the workers), got {g}")
        return self.n_workers // g

    def t_conv(self, k: int) -> float:
        """Conv-phase time of a group of k devices: max(T_cc / k, T_nc · k) (Omnivore appendix D-D),
        with the per-batch part `t_conv_fixed` paid whole by each device: (T_cc − t_conv_fixed) / k +
        t_conv_fixed in place of T_cc / k."""
        if int(k) < 1:
            raise ValueError(f"group size k must be >= 1, got {k}")
        fixed = self.t_conv_fixed
        return max((self.T_cc - fixed) / k + fixed, self.T_nc * k)

    @staticmethod
    def shard_trips(k: int) -> int:
        """The remote shards' round trips on a group's critical path: their forward and backward
        (the k − 1 side by side), none when k = 1."""
        return 2 if int(k) > 1 else 0

    @staticmethod
    def round_trips(k: int, local: bool = False) -> int:
        """Round trips between processes on the critical path of one group's iteration: the FC step
        and the push (whose reply is the next pull) unless the group is `local` to the servers,
        and with k > 1 the remote shards' forward and backward (the k − 1 run side by side; at
        k > 2 the reduction tree among the shard servers adds its levels, not counted here)."""
        return (0 if local else 2) + HEModel.shard_trips(k)

    def t_group(self, k: int, local: bool = False) -> float:
        """One group's time per iteration: t_conv(k) + t_fc + round_trips(k, local) · t_call, the
        shards' trips at `t_shard_call` when it is set."""
        shard = self.shard_trips(k)
        per_shard = self.t_shard_call or self.t_call
        servers = self.round_trips(k, local) - shard
        return self.t_conv(k) + self.t_fc + servers * self.t_call + shard * per_shard

    def _conv_bound(self, g: int) -> float:
        """1 / Σ 1/t_i over the g groups: (t_conv(k) + t_fc) / g when t_call = 0."""
        g, k = int(g), self.group_size(g)
        if self.t_call == 0 and self.t_shard_call == 0:
            return (self.t_conv(k) + self.t_fc) / g
        local = min(int(self.local_groups), g)
        return 1.0 / (local / self.t_group(k, True) + (g - local) / self.t_group(k, False))

    def t_cpu(self, g: int) -> float:
        """The CPU bound on the time per iteration: the CPU one iteration needs over the cores left
        by the background, (cpu_work + trips · cpu_call) / (cores − cpu_background), trips the
        groups' mean `round_trips`; 0 when cores = 0.

        Whatever the processes do besides the compute comes out of the same cores."""
        if not self.cores:
            return 0.0
        g, k = int(g), self.group_size(g)
        local = min(int(self.local_groups), g)
        trips = (local * self.round_trips(k, True) + (g - local) * self.round_trips(k, False)) / g
        work = (self.cpu_work or self.T_cc + self.t_fc) + trips * self.cpu_call
        return work / (self.cores - self.cpu_background)

    def t_servers(self, g: int) -> float:
        """The servers' process's time per iteration: t_fc + (local · t_conv(k) + (g − local) ·
        trips · cpu_call / 2) / g, local = `local_groups` (at most g), trips the remote groups'
        `round_trips`; Omnivore's t_fc when no group's lead shares the servers' process.

        Omnivore gives the merged FC server a machine of its own. Where it shares a process with
        groups' leads, that process also runs their convolutions and its half of the other groups'
        round trips (deserialising their activations, serialising the replies), one at a time: the
        FC step of one group waits while the lead's conv holds the process."""
        g, k = int(g), self.group_size(g)
        local = min(int(self.local_groups), g)
        if not local:
            return self.t_fc
        remote_cpu = (g - local) * self.round_trips(k, False) * self.cpu_call / 2.0
        return self.t_fc + (local * self.t_conv(k) + remote_cpu) / g

    def he(self, g: int) -> float:
        """Predicted time per iteration HE(g) = max{t_fc, (t_conv(N/g) + t_fc) / g} (§IV-B), each
        group's iteration with its round trips' `t_call`, t_fc as the servers' process's share
        (`t_servers(g)`), and at least `t_cpu(g)` (see the class)."""
        return max(self.t_servers(g), self._conv_bound(g), self.t_cpu(g))

    def saturates(self, g: int) -> bool:
        """True when g groups saturate the FC server: t_conv(k) + t_fc < g · t_fc (Omnivore appendix D-D),
        each group's iteration with its round trips' `t_call`, the servers' share `t_servers(g)`."""
        if self.t_call == 0 and self.t_shard_call == 0 and not self.local_groups:
            return self.t_conv(self.group_size(g)) + self.t_fc < int(g) * self.t_fc
        return self._conv_bound(g) < self.t_servers(g)

    def smallest_saturating_g(self, gs: Iterable[int] | None = None) -> int | None:
        """The fewest groups that saturate the FC server, or None (where Omnivore's optimizer starts, §V).

        `gs` restricts the candidates (default 1..N), e.g. to the divisors of N.
        """
        candidates = range(1, self.n_workers + 1) if gs is None else sorted(int(g) for g in gs)
        return next((g for g in candidates if self.saturates(g)), None)

    def curve(self, gs: Iterable[int] | None = None) -> pd.DataFrame:
        """HE(g) for each g (default 1..N): k, t_conv, time per iteration, saturation, P_HE."""
        gs = list(range(1, self.n_workers + 1)) if gs is None else [int(g) for g in gs]
        he1 = self.he(1)
        rows = [
            {
                "n_groups": g,
                "k": self.group_size(g),
                "t_conv": self.t_conv(self.group_size(g)),
                "t_fc": self.t_fc,
                "time_per_iter": self.he(g),
                "fc_saturated": self.saturates(g),
                "P_HE": self.he(g) / he1,
            }
            for g in gs
        ]
        return pd.DataFrame(rows).set_index("n_groups")


def t_parameter_server(grad_bytes: float, p: int, bandwidth_bytes_per_s: float) -> float:
    """Parameter-server gradient communication time |∇W| · p / BW (FireCaffe §6.1, Eq. 3)."""
    _positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")
    return float(grad_bytes) * int(p) / float(bandwidth_bytes_per_s)


def t_reduction_tree(grad_bytes: float, p: int, bandwidth_bytes_per_s: float) -> float:
    """Reduction-tree gradient communication time |∇W| · 2 · log2(p) / BW (FireCaffe §6.2, Eq. 4)."""
    _positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")
    if int(p) < 1:
        raise ValueError(f"p must be >= 1, got {p}")
    return float(grad_bytes) * 2.0 * math.log2(int(p)) / float(bandwidth_bytes_per_s)


def time_per_iteration(trace: pd.DataFrame, warmup: int = 0) -> float:
    """Measured time per iteration of a Trace: 1 / (updates per unit time, all groups together).

    Each group's period is the mean spacing of its consecutive `t_end` (after skipping its first
    `warmup` completions); the groups' rates add up. This is what HE(g) predicts (Omnivore §IV-B),
    in the trace's time unit, and it does not depend on where in a round of groups the run stopped.
    Runs where no group completed twice fall back to the elapsed time over the updates.
    """
    if len(trace) == 0:
        return float("nan")
    rate = 0.0
    for _, t_end in trace.groupby("group")["t_end"]:
        t = np.sort(t_end.to_numpy(dtype=float))[int(warmup) :]
        if len(t) >= 2 and t[-1] > t[0]:
            rate += (len(t) - 1) / (t[-1] - t[0])
    if rate == 0.0:
        return float((trace["t_end"].max() - trace["t_start"].min()) / len(trace))
    return 1.0 / rate


def _positive(value: float, name: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
