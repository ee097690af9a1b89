"""Pin each Dask transport: the final weights of a fixed number of iterations, per transport.

Runs LeNet on 28-pixel digits for a fixed iteration budget with one compute group (g = 1) on a
LocalCluster, once per physical map (merged, unmerged) and transport: inline (a group of one
worker, k = 1), shard-server actors (k = 2), tasks (k = 2, `shard_calls='tasks'`, and
`aggregation='ps'`), and the actors with k = 3 (a reduction tree among the shard servers). Each
run's final weights go to one .npz per transport.

    python experiments/pin_transports.py write OUT_DIR [NAME ...]   # PYTHONPATH: the code to pin
    python experiments/pin_transports.py compare A_DIR B_DIR

`compare` says, per transport, whether every weight array is bit-identical (np.array_equal on the
raw arrays). Run `write` twice on the same machine, once per commit, then `compare`: the worker
iteration may be restructured only if every transport stays identical. One group and a fixed
iteration budget make a run deterministic: the batches, the dropout streams and the order of the
updates do not depend on timing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ITERATIONS = 6
TRANSPORTS = {
    # name: (physical map, workers, shard_calls, aggregation); the one group takes every worker
    # (k = the workers), the FC server or the model servers share its lead worker
    "merged-inline": ("merged", 1, "actors", "tree"),
    "merged-actors": ("merged", 2, "actors", "tree"),
    "merged-tasks": ("merged", 2, "tasks", "tree"),
    "merged-ps": ("merged", 2, "actors", "ps"),
    "unmerged-inline": ("unmerged", 1, "actors", "tree"),
    "unmerged-actors": ("unmerged", 2, "actors", "tree"),
    "unmerged-tasks": ("unmerged", 2, "tasks", "tree"),
    "unmerged-ps": ("unmerged", 2, "actors", "ps"),
    "merged-actors-k3": ("merged", 3, "actors", "tree"),  # the reduction tree among the servers
    "unmerged-actors-k3": ("unmerged", 3, "actors", "tree"),
}


def run_one(name: str) -> dict[str, np.ndarray]:
    """The final weights of transport `name` after ITERATIONS iterations from a seeded LeNet."""
    from dasknn.data import load
    from dasknn.engine.dask.driver import DaskEngine, local_client
    from dasknn.engine.strategy import Strategy
    from dasknn.engine.trace import Budget, RunConfig
    from dasknn.nn.zoo import get_net

    physical_map, n_workers, shard_calls, aggregation = TRANSPORTS[name]
    X, y = load("digits", size=28, batch_size=32)
    X, y = X[:256].persist(), y[:256].persist()
    net = get_net("lenet", input_shape=(1, 28, 28), num_classes=10, seed=0)
    config = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=32, seed=3)
    with local_client(n_workers=n_workers) as client:
        engine = DaskEngine(
            client,
            strategy=Strategy(physical_map=physical_map, aggregation=aggregation),
            shard_calls=shard_calls,
            data="persist",
        )
        result = engine.run(net, X, y, config, Budget(iterations=ITERATIONS))
    k = len(engine.placement_.groups[0])
    expected_k = n_workers
    if k != expected_k or len(result.trace) != ITERATIONS:
        raise RuntimeError(f"{name}: ran k={k} (expected {expected_k}), {len(result.trace)} iterations")
    return result.state.params


def write(out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in names or TRANSPORTS:
        params = run_one(name)
        np.savez(out / f"{name}.npz", **params)
        print(f"{name}: {len(params)} arrays written", flush=True)


def compare(a: Path, b: Path) -> int:
    differ = 0
    for name in TRANSPORTS:
        pa, pb = np.load(a / f"{name}.npz"), np.load(b / f"{name}.npz")
        same = set(pa.files) == set(pb.files) and all(np.array_equal(pa[k], pb[k]) for k in pa.files)
        worst = max(float(np.max(np.abs(pa[k] - pb[k]))) for k in pa.files) if not same else 0.0
        print(f"{name:18s} {'identical' if same else f'DIFFERENT (max |diff| {worst:.3g})'}")
        differ += not same
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(Path(sys.argv[2]), sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
