"""Benchmark of the process around the loop: the estimator's import, `dasknn train`'s wall outside the loop.

Two measurements, each in fresh processes, interleaved round by round (a busy machine moves
wall-clock numbers: compare only numbers of the same rounds; the machine's load is printed):

- import: the wall time of `from dasknn import DistributedCNN` in a fresh interpreter (its own
  `perf_counter` around the import, the interpreter's start not included), next to
  `from sklearn.base import BaseEstimator` alone, the floor: DistributedCNN is a scikit-learn
  BaseEstimator, and sklearn.base brings numpy, scipy and pandas with it. Also printed: which of the
  modules dasknn imports at first use (`DEFERRED`) the import loaded anyway.
- train: one `python -m dasknn train` process on the main job (LeNet on mnist-sample, 20% held out,
  a LocalCluster of 2 workers, the prior cache off: DASKNN_PRIOR_CACHE=off), fixed knobs g = 2,
  η = 0.03, µ = 0.9 by default (`--flags ''` for "auto"). The process's wall is measured around the
  subprocess; the loop's wall is the history's last `wall_time` (from the loop's creation);
  outside = process − loop. Its parts come from the times at which the process passed named
  points of the command (`PROBE`: the process runs `python -m dasknn` through a probe that wraps
  those functions as their modules load, and writes the times when the process ends):
  `import` (the interpreter's start and the command's imports), `options` (parsing, checks; on a
  checkout whose command reads the data before starting the cluster, the data too), `data` (the
  dataset's load), `cluster_start` (the cluster's start on its thread, workers' imports included:
  beside the main thread, not part of the sum), `cluster_wait` (the main thread waiting for it),
  `fit_setup` (the fit's input checks, the carve of the held-out part, shipping the data to the
  workers, the engine's start: from `fit` to the loop's creation), `fit_end` (after the loop's
  last history row: the returned model's scoring, the records), `report` (the run folder's files,
  model and plot), `close_wait` (waiting for the cluster's close after the report), `exit_s` (from
  `os._exit` to the process's end), and `rest` (outside less the main thread's parts: what
  lies between them). Also the CPU-seconds of each process (its tree's, for `dasknn train`: the
  workers' and a fork server's too, reaped by the benchmark as their subreaper), which a busy
  machine moves less than wall time.

Every process runs with a bytecode cache of the benchmark's own (PYTHONPYCACHEPREFIX, written
whatever PYTHONDONTWRITEBYTECODE says, filled by a first round, -1, which is not counted): an
installed package has its modules compiled; compiling dasknn's at every start is not what a user
waits for.

`--base PATH` runs the same measurements on another checkout (PYTHONPATH=PATH), in the same rounds:
before and after on one machine state.

    python -m experiments.bench_startup [--reps 5] [--base /path/to/checkout] [--no-train] [--flags ...]

Writes bench_startup_<time>.csv (every measurement) under experiments/results/bench_startup/ and
prints the medians.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common import machine_line, parser, repetitions, results_dir, timestamp, write_tables  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFERRED = ("dask", "dask.array", "distributed", "xarray", "matplotlib", "scipy", "pandas", "torch")
"""Modules reported as loaded (or not) by `from dasknn import DistributedCNN`."""
STATEMENTS = {
    "sklearn.base": "from sklearn.base import BaseEstimator",
    "dasknn": "from dasknn import DistributedCNN",
}
MAIN_JOB = "--n-groups 2 --lr 0.03 --momentum 0.9"
PARTS = (
    "import", "options", "data", "cluster_start", "cluster_wait", "fit_setup", "fit_end", "report",
    "close_wait", "exit_s", "rest",
)  # fmt: skip
"""The parts of `dasknn train`'s wall outside the loop (the module docstring)."""


def environment(tree: Path, cache: Path) -> dict[str, str]:
    """The processes' environment: `tree` first on the path, the benchmark's bytecode cache."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def import_once(statement: str, env: dict[str, str]) -> dict:
    """Seconds of `statement` in a fresh interpreter (`env`: `environment`), and the `DEFERRED`
    modules it loaded."""
    probe = (
        "import json, sys, time\n"
        "t, c = time.perf_counter(), time.process_time()\n"
        f"{statement}\n"
        "t, c = time.perf_counter() - t, time.process_time() - c\n"
        f"print(json.dumps([t, c, [m for m in {list(DEFERRED)!r} if m in sys.modules]]))\n"
    )
    # run from the file system's root: `python -c` puts its working directory first on the path
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, cwd="/"
    )
    seconds, cpu, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return {"seconds": seconds, "cpu_seconds": cpu, "loaded": " ".join(loaded)}


PROBE = r"""
import importlib.abc, importlib.util, json, os, runpy, sys, time

out, marks = sys.argv.pop(1), {}


def mark(name):
    marks.setdefault(name, time.time())


def wrapped(f, before, after):
    def call(*args, **kwargs):
        if before:
            mark(before)
        try:
            return f(*args, **kwargs)
        finally:
            if after:
                mark(after)

    return call


POINTS = {  # module: (its attribute (a class's too), mark at the call, mark at the return)
    "dasknn.cli": [
        ("_load_dataset", "load_start", "load_end"), ("_report_run", "report_start", "report_end"),
    ],
    "dasknn.cli.train": [
        ("load_dataset", "load_start", "load_end"), ("write_run", "report_start", "report_end"),
    ],
    "dasknn.cluster": [
        ("ClusterAhead.__init__", "ahead", None), ("ClusterAhead._started", None, "cluster_ready"),
        ("ClusterAhead.client", "client_called", "cluster_waited"),
        ("ClusterAhead.close_behind", "close_start", None), ("ClusterAhead._close", None, "cluster_closed"),
        ("ClusterAhead.__exit__", None, "close_waited"),
    ],
    "dasknn.estimator": [("DistributedCNN.fit", "fit_start", "fit_end")],
    "dasknn.estimator_fit": [("FitSettings.build_loop", "loop_built", None)],
}


class Points(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in POINTS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if name == "dasknn.cli":
                mark("imported")
            for where, before, after in POINTS[name]:
                owner, _, attr = where.rpartition(".")
                owner = getattr(module, owner) if owner else module
                if hasattr(owner, attr):
                    setattr(owner, attr, wrapped(getattr(owner, attr), before, after))

        spec.loader.exec_module = exec_module
        return spec


def written(code=0):
    mark("exit_called")
    with open(out, "w") as f:
        json.dump(marks, f)
    end(code)


end, os._exit = os._exit, written
sys.meta_path.insert(0, Points())
sys.argv[0] = "dasknn"
try:
    runpy.run_module("dasknn", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    written(stop.code if isinstance(stop.code, int) else 1)
written(0)
"""
"""`python -c PROBE marks.json train ...`: `python -m dasknn train ...`, writing to marks.json the
times (`time.time()`) at which the process passed the points of `POINTS`."""


def parts(marks: dict[str, float], start: float, end: float, loop: float) -> dict[str, float]:
    """The parts of a `dasknn train` process outside its loop (the module docstring), from the
    probe's `marks`, the process's `start` and `end` and the loop's wall."""

    def span(a: str, b: str) -> float:
        return marks[b] - marks[a] if a in marks and b in marks else float("nan")

    marks = {"start": start, "end": end, **marks}
    row = {
        "import": span("start", "imported"),
        "options": span("imported", "ahead" if "ahead" in marks else "load_start"),
        "data": span("load_start", "load_end"),
        "cluster_start": span("ahead", "cluster_ready"),
        "cluster_wait": span("client_called", "cluster_waited"),
        "fit_setup": span("fit_start", "loop_built"),
        "fit_end": span("loop_built", "fit_end") - loop,
        "report": span("report_start", "report_end"),
        "close_wait": span("report_end", "close_waited"),
        "exit_s": span("exit_called", "end"),
    }
    main_thread = sum(v for k, v in row.items() if k != "cluster_start" and v == v)
    row["rest"] = end - start - loop - main_thread
    return row


def adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux's child subreaper): a fork
    server that `dasknn train` started, and the workers forked from it, outlive the command by a
    moment and are no child of it; reaped here, their CPU-seconds count in RUSAGE_CHILDREN."""
    import ctypes

    pr_set_child_subreaper = 36
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def reap_orphans(within: float = 30.0) -> None:
    """Wait (at most `within` seconds) for the orphans `adopt_orphans` made this process's children."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def train_once(env: dict[str, str], flags: list[str], folder: Path) -> dict:
    """One `dasknn train` process of the main job (`env`: `environment`) through `PROBE`: its
    wall, CPU-seconds, the loop's wall and the parts of the rest (`parts`)."""
    env = {**env, "DASKNN_PRIOR_CACHE": "off"}
    marks = folder.parent / "marks.json"
    command = [sys.executable, "-c", PROBE, str(marks), "train", "--output", str(folder), *flags]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=folder.parent)
    end = time.time()
    reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    row = {"exit": done.returncode, "process_wall": end - start, "cpu_seconds": cpu}
    history = folder / "history.csv"
    if not history.is_file() or not marks.is_file():
        print(done.stderr[-2000:], file=sys.stderr)
        return row
    loop = float(pd.read_csv(history)["wall_time"].iloc[-1])
    row.update(loop_wall=loop, outside_loop=end - start - loop)
    row.update(parts(json.loads(marks.read_text()), start, end, loop))
    return row


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cli = parser(__doc__, reps=(5, 2))
    cli.add_argument("--base", type=Path, help="another checkout, measured in the same rounds")
    cli.add_argument("--no-train", action="store_true", help="the import only")
    cli.add_argument("--flags", default=MAIN_JOB, help=f"dasknn train's flags (default {MAIN_JOB!r})")
    args = cli.parse_args(argv)
    adopt_orphans()
    trees = {"this": ROOT, **({"base": args.base.resolve()} if args.base else {})}
    print(machine_line(), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        envs = {tree: environment(path, Path(tmp) / "pycache") for tree, path in trees.items()}
        for r in range(-1, repetitions(args)):  # round -1 fills the bytecode cache
            order = list(envs.items())
            for tree, env in order if r % 2 == 0 else order[::-1]:  # each checkout first in turn
                for name, statement in STATEMENTS.items():
                    if name == "sklearn.base" and tree != "this":
                        continue  # the floor does not depend on the checkout
                    row = {"round": r, "tree": tree, "measure": f"import {name}"}
                    row.update(import_once(statement, env))
                    rows.append(row)
                    print(row, flush=True)
                if not args.no_train:
                    folder = Path(tmp) / f"{r}_{tree}" / "run"
                    folder.parent.mkdir(parents=True)
                    load = os.getloadavg()[0]
                    row = {"round": r, "tree": tree, "measure": "train", "load_before": load}
                    row.update(train_once(env, shlex.split(args.flags), folder))
                    rows.append(row)
                    print(row, flush=True)
    table = pd.DataFrame(rows)
    table = table[table["round"] >= 0]
    print(machine_line())
    imports = table[table["measure"].str.startswith("import")]
    print(imports.groupby(["tree", "measure"], sort=False)[["seconds", "cpu_seconds"]].median().to_string())
    for (tree, name), grp in imports.groupby(["tree", "measure"], sort=False):
        print(f"{tree} {name} loaded: {grp['loaded'].iloc[-1] or 'none of ' + ', '.join(DEFERRED)}")
    trains = table[table["measure"] == "train"]
    if len(trains):
        named = ("process_wall", "cpu_seconds", "loop_wall", "outside_loop", *PARTS)
        columns = [c for c in named if c in trains]
        print(trains.groupby("tree", sort=False)[columns].median().T.to_string())
    write_tables(results_dir("bench_startup"), {"": table}, f"bench_startup_{timestamp()}")
    return table


if __name__ == "__main__":
    main()
