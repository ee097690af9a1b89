"""Pin the training loop's behaviour on the simulated engine: history, decisions and final weights.

Each case is a fit of the digits MLP on the SimulatedEngine (deterministic: no wall clock enters its
runs), one per policy (Omnivore's Algorithm 1 "grid", the "online" optimizer, fixed knobs, and the
default "auto" tuner with its prior cache off), each
also on a fit that diverges and rolls back, a grid fit whose time budget ends mid-search, and
resumes from the first checkpoint of a fit. `write DIR` stores every case (weights as .npz, the
records as JSON); `compare A B` says whether two such directories are identical (weights exactly,
records to the last bit) and prints the first difference. Used to show that a refactoring of the
loop leaves its behaviour unchanged, against a worktree of the commit it starts from:

    PYTHONPATH=/work/wt-base python -m experiments.pin_loop write /tmp/pins-base
    PYTHONPATH=$PWD python -m experiments.pin_loop write /tmp/pins-new
    python -m experiments.pin_loop compare /tmp/pins-base /tmp/pins-new

`compare A B TABLE.COLUMN ...` leaves those columns out (e.g. `history.loss history.accuracy`,
the history's training figures, which come from the trace's iterations since they stopped being
a scoring of training samples: the records otherwise identical show that nothing else moved).
Against pins written before that change, the "auto" case also differs in its decisions' reasons
only: its progress is measured on the tuner's own training samples (`MEASURED_SAMPLES`, 2,000:
here all of the training part) where it read the history's loss on `eval_size` (200) samples;
its decisions and weights are the same (and with MEASURED_SAMPLES = 200 its records are too).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

from dasknn.optimizer import OnlinePolicy

os.environ["DASKNN_PRIOR_CACHE"] = "off"  # a pin must not depend on the "auto" tuner's cache of earlier fits

COMMON = {
    "net": "mlp",
    "input_shape": "flat",
    "engine": "simulated",
    "simulated_gflops": 10.0,
    "n_workers": 4,
    "batch_size": 32,
    "time_budget": None,
    "eval_size": 200,
}
FIXED = {"n_groups": 2, "learning_rate": 0.1, "momentum": 0.9}

CASES: dict[str, dict] = {
    "fixed": {**FIXED, "max_epochs": 3},
    "fixed_diverges": {**FIXED, "learning_rate": 50.0, "max_epochs": 3},
    "grid": {"tuner": "grid", "max_epochs": 8},
    "grid_diverges": {"tuner": "grid", "max_epochs": 8, "poison_row": 1500},
    "grid_budget_mid_search": {"tuner": "grid", "time_budget": 0.05},
    "auto": {"max_epochs": 8},
    "online": {"tuner": "online", "max_epochs": 6},
    "online_diverges": {"tuner": OnlinePolicy(initial_lr=1000.0), "max_epochs": 6},
    "online_diverges_always": {"tuner": "online", "max_epochs": 6, "poison_row": 700},
}
RESUMED = ("fixed", "grid", "online")
"""Cases also fitted with checkpoints, then resumed from their first checkpoint alone.

`poison_row`: that sample of X is scaled by 3e37, so that every run whose batches reach it diverges
(a grid fit whose probes miss it and whose training hits it; an online fit that gives up)."""


def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


def _plain(value):
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return repr(value) if not math.isfinite(value) else value
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _records(rows) -> list[dict]:
    return [{k: _plain(v) for k, v in row.items() if not k.startswith("wall")} for row in rows]


def fitted(params: dict, X, y):
    from dasknn.estimator import DistributedCNN

    params = dict(params)
    row = params.pop("poison_row", None)
    if row is not None:
        X = X.copy()
        X[row] *= np.float32(3e37)
    unbounded = {}
    if "max_wall_time" in DistributedCNN().get_params():  # a real-time bound: pins on load
        unbounded["max_wall_time"] = None
    return DistributedCNN(**{**COMMON, **unbounded, **params}).fit(X, y)


def save(est, out: Path, name: str) -> None:
    from dataclasses import asdict

    np.savez(out / f"{name}.npz", **{f"p_{k}": v for k, v in est.state_.params.items()},
             **{f"m_{k}": v for k, v in est.state_.momentum.items()})  # fmt: skip
    trace = est.trace_
    keep = [c for c in ("t_start", "t_end", "loss", "phase", "run", "kept", "lr", "momentum") if c in trace]
    record = {
        "history": _records(est.history_),
        "decisions": _records(est.decisions_.to_dict("records")),
        "trace": _records(trace[keep].to_dict("records")),
        "config": asdict(est.config_),
        "n_iter": int(est.n_iter_),
    }
    (out / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True))


def write(out: Path) -> None:
    from dasknn.engine import checkpoint

    out.mkdir(parents=True, exist_ok=True)
    X, y = digits()
    for name, params in CASES.items():
        try:
            save(fitted(params, X, y), out, name)
            print(f"{name}: written")
        except Exception as err:  # a case that raises pins its error
            (out / f"{name}.json").write_text(json.dumps({"error": f"{type(err).__name__}: {err}"}))
            print(f"{name}: {type(err).__name__}: {err}")
    for name in RESUMED:
        with tempfile.TemporaryDirectory() as tmp:
            whole, part = Path(tmp) / "whole", Path(tmp) / "part"
            fitted({**CASES[name], "checkpoint_dir": whole}, X, y)
            first = checkpoint.list_checkpoints(whole)[0]
            part.mkdir()
            shutil.copytree(first, part / first.name)
            resumed = fitted({**CASES[name], "checkpoint_dir": part, "resume": True}, X, y)
            save(resumed, out, f"{name}_resumed")
            print(f"{name}_resumed: written (from {first.name})")


def _first_difference(a, b, where: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                value = a.get(key, b.get(key))
                if value is None or value == "nan" or (isinstance(value, float) and math.isnan(value)):
                    continue  # a column one side lacks and the other leaves empty
                return f"{where}.{key}: only in one"
            found = _first_difference(a[key], b[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} rows vs {len(b)}"
        for i, (x, z) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, z, f"{where}[{i}]")
            if found:
                return found
        return None
    same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return None if same else f"{where}: {a!r} vs {b!r}"


def _without(record: dict, ignored: list[str]) -> dict:
    """`record` less the TABLE.COLUMN entries of `ignored` in each row of its tables."""
    for entry in ignored:
        table, column = entry.split(".", 1)
        for row in record.get(table, []):
            row.pop(column, None)
    return record


def compare(a: Path, b: Path, ignored: list[str] = ()) -> bool:
    ok = True
    for path in sorted(a.glob("*.json")):
        name = path.stem
        diff = _first_difference(
            _without(json.loads(path.read_text()), list(ignored)),
            _without(json.loads((b / path.name).read_text()), list(ignored)),
        )
        weights = "no weights"
        if (a / f"{name}.npz").exists():
            wa, wb = np.load(a / f"{name}.npz"), np.load(b / f"{name}.npz")
            same = set(wa) == set(wb) and all(np.array_equal(wa[k], wb[k]) for k in wa)
            weights = "weights identical" if same else "WEIGHTS DIFFER"
            ok = ok and same
        ok = ok and diff is None
        print(f"{name:28s} {'records identical' if diff is None else 'DIFFER ' + diff}; {weights}")
    return ok


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(Path(sys.argv[2]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "compare":
        sys.exit(0 if compare(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]) else 1)
    else:
        sys.exit(__doc__)
