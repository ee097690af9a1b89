"""The free prior of the "auto" optimizer: where a fit starts before anything is measured.

Searching cannot pay on short jobs (Omnivore appendix E treats a job that converges in seconds as
all cold start; Pollux starts from the user's batch size and rate and never explores first), so
"auto" starts from what costs nothing:

- g: the *smallest* number of groups whose predicted time per iteration (the HE model, Omnivore
  §IV-B) is within `tolerance` (10%) of the best g's: past that point more groups only add
  staleness (implicit momentum, Theorem 1) for little speed.
- η and µ: the net's own solver (a Caffe solver file's `base_lr` and `momentum`; for a zoo net the
  values of the solver Caffe published with it, `ZOO_SOLVERS`), else the values Caffe's reference
  solvers use, η = 0.01 and µ = 0.9 (`CAFFE_DEFAULTS`).
- or, before both, the configuration the last successful fit of the same net, dataset, batch size,
  input shape and weight decay ended with (`PriorCache`, a JSON file in the user's cache folder),
  when a fit asks for it (off by default: a fit then depends on nothing but its arguments).

Each choice comes back with a sentence naming its source, for the decisions log.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dasknn.engine.trace import COLD_START
from dasknn.tradeoff.hardware import HEModel

__all__ = [
    "CACHE_ENV",
    "CACHE_FILE",
    "CAFFE_DEFAULTS",
    "ZOO_SOLVERS",
    "Prior",
    "PriorCache",
    "dataset_key",
    "default_cache_path",
    "groups_prior",
    "net_key",
    "solver_prior",
]

CAFFE_DEFAULTS = {"base_lr": COLD_START.lr, "momentum": COLD_START.momentum}
"""η and µ of Caffe's reference solvers (examples/mnist/lenet_solver, models/bvlc_reference_caffenet):
the start of a net that has no solver of its own."""

ZOO_SOLVERS: dict[str, dict[str, Any]] = {
    "lenet": {"base_lr": 0.01, "momentum": 0.9, "weight_decay": 0.0005,
              "file": "examples/mnist/lenet_solver.prototxt"},
    "cifar10_quick": {"base_lr": 0.001, "momentum": 0.9, "weight_decay": 0.004,
                      "file": "examples/cifar10/cifar10_quick_solver.prototxt"},
    "cifar10_full": {"base_lr": 0.001, "momentum": 0.9, "weight_decay": 0.004,
                     "file": "examples/cifar10/cifar10_full_solver.prototxt"},
    "caffenet": {"base_lr": 0.01, "momentum": 0.9, "weight_decay": 0.0005,
                 "file": "models/bvlc_reference_caffenet/solver.prototxt"},
    "resnet20": {"base_lr": 0.1, "momentum": 0.9, "weight_decay": 0.0001,
                 "file": "He et al. 2016, §4.2 (CIFAR-10 ResNets; no Caffe solver)"},
}  # fmt: skip
"""The solver values published with each zoo net (Caffe's files at BVLC/caffe commit 9b89154; the
paper's for resnet20); `mlp` has none and starts from `CAFFE_DEFAULTS`."""

CACHE_FILE = "auto-prior-cache.json"
"""The prior cache's file name in the user's cache folder (`cache_home`)."""
CACHE_ENV = "DASKNN_PRIOR_CACHE"
"""Environment variable: "off" turns the cache off even where a fit asks for it, a path puts it there
(the test suite sets "off")."""


@dataclass(frozen=True)
class Prior:
    """A starting configuration and where it came from (one line for the decisions log)."""

    n_groups: int
    lr: float
    momentum: float
    source: str


def groups_prior(model: HEModel, candidates: Sequence[int], tolerance: float = 0.1) -> tuple[int, str]:
    """(g, why): the smallest candidate g whose HE(g) is within `tolerance` of the best candidate's.

    Omnivore §IV-B's time per iteration HE(g) = max{t_fc, (t_conv(N/g) + t_fc)/g}; candidates above
    N (the model's workers) are ignored. A smaller g has less implicit momentum (Theorem 1), so it
    is preferred whenever it costs at most `tolerance` in time per iteration.
    """
    usable = sorted(int(g) for g in candidates if 1 <= int(g) <= model.n_workers)
    if not usable:
        raise ValueError(f"no candidate g in [1, {model.n_workers}] among {list(candidates)}")
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    times = {g: model.he(g) for g in usable}
    best = min(times.values())
    g = next(g for g in usable if times[g] <= (1 + tolerance) * best)
    best_g = min(times, key=times.get)
    return g, (
        f"smallest g with HE(g) = {times[g]:.4g} within {tolerance:.0%} of the best "
        f"(HE({best_g}) = {best:.4g})"
    )


def solver_prior(net: Any, solver: Mapping[str, Any] | None = None) -> tuple[float, float, str]:
    """(η, µ, source): a given solver's values (`read_solver`'s dict), else a zoo net's published
    solver (`net` a zoo name or a `Net` whose name is one), else `CAFFE_DEFAULTS`."""
    if solver is not None:
        for key in ("base_lr", "momentum"):
            if key not in solver:
                raise ValueError(f"solver settings lack {key!r}: {sorted(solver)}")
        lr, mu = float(solver["base_lr"]), float(solver["momentum"])
        if not (lr > 0 and math.isfinite(lr) and 0 <= mu < 1):
            raise ValueError(f"solver's base_lr must be > 0 and momentum in [0, 1); got {lr}, {mu}")
        return lr, mu, f"the net's solver (base_lr {lr:g}, momentum {mu:g})"
    name = net if isinstance(net, str) else getattr(net, "name", None)
    key = str(name).lower().replace("-", "_") if name is not None else None
    if key in ZOO_SOLVERS:
        s = ZOO_SOLVERS[key]
        return s["base_lr"], s["momentum"], f"{key}'s published solver ({s['file']})"
    lr, mu = CAFFE_DEFAULTS["base_lr"], CAFFE_DEFAULTS["momentum"]
    return lr, mu, f"Caffe's reference solver values (η = {lr:g}, µ = {mu:g}): the net has no solver"


def net_key(net: Any) -> str:
    """A stable description of a net's architecture: its name, layers and parameter shapes."""
    parts = [str(getattr(net, "name", net))]
    params = net.get_params() if callable(getattr(net, "get_params", None)) else {}
    parts += [f"{k}:{tuple(v.shape)}" for k, v in sorted(params.items())]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def dataset_key(X, rows: int = 16) -> str:
    """A dataset's identity for the cache: shape, dtype and a hash of its first and last `rows`
    samples (a dask array computes only those)."""
    import numpy as np

    n = int(X.shape[0])
    head = np.asarray(X[: min(rows, n)])
    tail = np.asarray(X[max(0, n - rows) :])
    digest = hashlib.sha1(head.tobytes() + tail.tobytes()).hexdigest()[:12]
    return f"{'x'.join(str(int(d)) for d in X.shape)}-{np.dtype(X.dtype).name}-{digest}"


def cache_home() -> Path:
    """The user's cache folder for dasknn: `$XDG_CACHE_HOME/dasknn`, else `~/.cache/dasknn` (the XDG
    base directory rule that platformdirs follows on Linux). Never a source checkout's folder: what
    one fit leaves there must not change the next fit of the same code. Not created here."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base).expanduser() if base else None
    return (root if root is not None and root.is_absolute() else Path.home() / ".cache") / "dasknn"


def default_cache_path() -> Path | None:
    """`$DASKNN_PRIOR_CACHE` (None when "off"), else `CACHE_FILE` in the user's cache folder."""
    env = os.environ.get(CACHE_ENV, "")
    if env.lower() in ("off", "0", "false", "no"):
        return None
    if env:
        return Path(env).expanduser()
    return cache_home() / CACHE_FILE


class PriorCache:
    """The configuration each successful fit ended with, keyed by what makes two fits the same job.

    The key: the net's architecture (`net_key`), the dataset (a caller's fingerprint: its shape and
    a hash of some of its samples), batch size, input shape and weight decay. A JSON file at `path`
    (by default `CACHE_FILE` in the user's cache folder, `cache_home`); unreadable or foreign
    content counts as empty.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        if path is None:
            path = default_cache_path()
        if path is None:
            raise ValueError(f"the prior cache is off (${CACHE_ENV}=off)")
        self.path = Path(path)

    @staticmethod
    def key(net: Any, dataset: str, batch_size: int, input_shape: Sequence[int], weight_decay: float) -> str:
        """The cache key of a job (see the class docstring)."""
        shape = "x".join(str(int(d)) for d in input_shape)
        return f"{net_key(net)}/{dataset}/b{int(batch_size)}/{shape}/wd{float(weight_decay):g}"

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Prior | None:
        """The cached prior of `key`, or None."""
        entry = self._read().get(key)
        try:
            return Prior(int(entry["n_groups"]), float(entry["lr"]), float(entry["momentum"]),
                         f"the last successful fit of this net and data ({self.path})")  # fmt: skip
        except (TypeError, KeyError, ValueError):
            return None

    def put(self, key: str, n_groups: int, lr: float, momentum: float) -> None:
        """Record a successful fit's end configuration. The read, the change and the write are one
        step under `_writing` (fits that end together, in threads or processes, each keep their
        entry), and the file is written atomically: a temporary file of a name no other writer
        uses, renamed into place."""
        entry = asdict(Prior(int(n_groups), float(lr), float(momentum), "fit"))
        del entry["source"]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _writing(self.path):
            data = self._read()
            data[key] = entry
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
                os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextmanager
def _writing(path: Path):
    """Hold the cache file `path` for one writer: a lock per file among this process's threads,
    and an advisory lock (`fcntl.flock`) on `<path>.lock` among processes where the system has
    one (POSIX); elsewhere only the threads are serialised."""
    with _THREAD_LOCKS_GUARD:
        lock = _THREAD_LOCKS.setdefault(str(path.resolve()), threading.Lock())
    with lock:
        try:
            import fcntl
        except ImportError:  # not POSIX: the rename still keeps the file whole
            yield
            return
        with open(path.with_name(path.name + ".lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
