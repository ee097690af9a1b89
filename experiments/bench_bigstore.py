"""Benchmark: one epoch streamed from a zarr store several times larger than the workers' memory.

`DistributedCNN(data="stream")` must train on data that does not fit in the cluster: each compute
group's lead worker reads the chunks of its batches from the store (a bounded read-ahead, a window
of chunks for shuffling) and holds nothing of X between batches. This script writes a learnable
uint8 store (`dasknn.data.synthetic` images, 0..255) of `--gb` gigabytes, starts a LocalCluster of
`--workers` nanny-supervised workers with `--memory-limit` each (the nanny kills and restarts a
worker that goes past 95% of it), trains a small CNN for one full epoch (every sample read once)
with the pixels scaled on the workers, and prints:

- the store's size against the workers' summed memory limit;
- each worker's peak resident memory (polled every 0.25 s with `client.run`) against its limit;
- whether any worker process was replaced (its pid at the end against the start);
- iterations, seconds and the held-out accuracy of the last evaluation.

The held-out part (0.2% here, 487 images) and the selection and evaluation samples are computed to
numpy arrays for scoring, so they must fit in a worker's and the client's memory; with 2% of this
store (240 MB of float32) the one task that assembles them went past a 500 MB worker's limit.

What it found (2-core AMD EPYC, 2026-11-25). With 2 workers × 500 MB and a 3 GB store no epoch
completed: carving the held-out and selection parts with dask's fancy indexing planned a shuffle
over every chunk and killed every worker for memory (now `data.chunks.take_rows`), then the
workers sat at 77-81% of 500 MB (dasknn's imports alone take ~195 MB of a worker) and dask paused
them. With 2 workers × 1 GB and a 6.2 GB store (504,320 images of 3×64×64, 3.1× the workers'
summed limit), one epoch of 1966 iterations of 256:

- evaluations every 3 s (no time budget), local_client's malloc tuning: 848 s, no worker
  replaced, peak RSS 799 MB (the lead) and 449 MB;
- evaluations every 180 s, tuning on: 565 s, but the lead's freed-and-kept heap grew to 95% of 1
  GB and the nanny restarted it once (the run recovered: the stream source scattered again);
- evaluations every 180 s, tuning off, the loops trimming the heap every 5 s (the defaults of this
  script now): **615 s, no worker replaced, peak RSS 578 MB and 303 MB**.

With `--imagefolder 50000` (generated JPEGs, 0.23 GB on disk, 0.61 GB of uint8 pixels): one
epoch of 194 iterations in 87 s, no worker replaced, peak RSS 596 MB and 270 MB.

    python -m experiments.bench_bigstore [--gb 3.0] [--workers 2] [--memory-limit 500MB]
    python -m experiments.bench_bigstore --imagefolder 50000 --memory-limit 1GB   # JPEGs instead

The store is written under `--out` (default experiments/results/bench_bigstore/) and removed after
the run unless `--keep`.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common import RESULTS_ROOT, machine_line, parser  # noqa: E402

SHAPE = (3, 64, 64)
CHUNK = 512


def small_net(seed: int = 0):
    """A strided conv, a pool and one FC layer: cheap enough that reading the store is the work."""
    from dasknn.nn.layers import Convolution, InnerProduct, Pooling, ReLU
    from dasknn.nn.net import Net

    layers = [
        Convolution("conv1", 16, 5, stride=4),
        ReLU("relu1"),
        Pooling("pool1", "max", 3, stride=2),
        InnerProduct("ip1", 10),
    ]
    return Net(layers, SHAPE, name="small", seed=seed)


def write_store(path: Path, n_samples: int, seed: int = 0):
    """A uint8 zarr store of synthetic images and their labels (numpy); written chunk by chunk."""
    import dask
    import dask.array as da

    from dasknn.data.synthetic import synthetic

    X, y = synthetic(n_samples=n_samples, shape=SHAPE, seed=seed, noise=0.3, batch_size=CHUNK)
    pixels = (X * 255).round().astype(np.uint8).rechunk((CHUNK, *SHAPE))
    with dask.config.set(scheduler="threads", num_workers=2):
        da.to_zarr(pixels, str(path), overwrite=True)
        labels = y.compute()
    return da.from_zarr(str(path)), labels


def write_imagefolder(root: Path, n_images: int, seed: int = 0):
    """`n_images` JPEGs of `dasknn.data.synthetic` images (SHAPE, quality 90) in one folder per
    class, then `dasknn.data.images.imagefolder` over them: decoded on the workers, chunk by chunk."""
    from PIL import Image

    from dasknn.data.images import imagefolder
    from dasknn.data.synthetic import synthetic

    X, y = synthetic(n_samples=n_images, shape=SHAPE, seed=seed, noise=0.3, batch_size=CHUNK)
    for label in np.unique(y.compute()):
        (root / f"class{label}").mkdir(parents=True, exist_ok=True)
    i = 0
    for xb, yb in zip(X.to_delayed().ravel(), y.to_delayed().ravel(), strict=True):
        pixels = (np.asarray(xb.compute()) * 255).round().clip(0, 255).astype(np.uint8)
        for image, label in zip(pixels, np.asarray(yb.compute()), strict=True):
            path = root / f"class{label}" / f"{i:07d}.jpg"
            Image.fromarray(image.transpose(1, 2, 0)).save(path, quality=90)
            i += 1
    X, y = imagefolder(root, size=SHAPE[1], batch_size=CHUNK)
    return X, y.compute()


def _rss_and_pid() -> tuple[int, int]:
    import psutil

    return psutil.Process().memory_info().rss, os.getpid()


class Watch:
    """Polls every worker's resident memory in a thread and keeps each worker's peak."""

    def __init__(self, client, period: float = 0.25) -> None:
        self.client, self.period = client, period
        self.peak: dict[str, int] = {}
        self.pids: dict[str, set[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for worker, (rss, pid) in self.client.run(_rss_and_pid).items():
                    self.peak[worker] = max(self.peak.get(worker, 0), rss)
                    self.pids.setdefault(worker, set()).add(pid)
            except Exception:  # a worker going away mid-poll: the pid check reports it
                pass
            self._stop.wait(self.period)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> dict:
    from dask.utils import parse_bytes

    from dasknn.engine.dask import local_client
    from dasknn.estimator import DistributedCNN

    cli = parser(__doc__)
    cli.add_argument("--gb", type=float, default=3.0, help="store size in GB (default 3.0)")
    cli.add_argument("--workers", type=int, default=2)
    cli.add_argument("--memory-limit", default="500MB", help="per worker (default 500MB)")
    cli.add_argument(
        "--imagefolder", type=int, default=None, metavar="N",
        help="stream N generated JPEGs from class folders instead of a zarr store of --gb",
    )  # fmt: skip
    cli.add_argument("--keep", action="store_true", help="keep the store after the run")
    cli.add_argument("--tune-malloc", action="store_true", help="local_client's malloc tuning (off)")
    cli.add_argument("--out", type=Path, default=RESULTS_ROOT / "bench_bigstore", help="store folder")
    args = cli.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    per_sample = int(np.prod(SHAPE))
    n = int(args.gb * 1e9 // per_sample) // CHUNK * CHUNK
    limit = parse_bytes(args.memory_limit)
    print(machine_line(), flush=True)
    t0 = time.perf_counter()
    where = out / ("store.zarr" if args.imagefolder is None else "images")
    if args.imagefolder is None:
        X, y = write_store(where, n)
    else:
        shutil.rmtree(where, ignore_errors=True)
        X, y = write_imagefolder(where, args.imagefolder)
        n = X.shape[0]
    store_bytes = sum(f.stat().st_size for f in where.rglob("*") if f.is_file())
    print(
        f"{'store' if args.imagefolder is None else 'JPEGs'}: {n:,} uint8 images {SHAPE}, "
        f"{X.nbytes / 1e9:.2f} GB of pixels ({store_bytes / 1e9:.2f} GB "
        f"on disk), written in {time.perf_counter() - t0:.0f} s; workers: {args.workers} × "
        f"{limit / 1e6:.0f} MB = {args.workers * limit / 1e9:.2f} GB → store / memory "
        f"{X.nbytes / (args.workers * limit):.1f}×",
        flush=True,
    )
    scaled = X.astype(np.float32) / 255  # the workers convert after reading uint8 chunks
    # an hour's budget: the fit evaluates every 180 s (budget / 20) rather than every 3 s, restarting
    # the engine's servers each time; the one epoch ends the fit long before
    est = DistributedCNN(
        net=small_net(), batch_size=256, n_groups=1, learning_rate=0.01, momentum=0.9, time_budget=3600,
        max_epochs=1, data="stream", validation_fraction=0.002, eval_size=500, verbose=0,
    )  # fmt: skip
    # glibc's default thresholds (no tune_malloc): arrays above 128 kB are mapped and returned to the
    # OS when freed, where local_client's tuning keeps arrays up to 32 MB in the heap (faster, but
    # the lead worker's resident memory then swings by hundreds of MB between trims)
    with local_client(n_workers=args.workers, memory_limit=limit, tune_malloc=args.tune_malloc) as client:
        start_pids = {w: pid for w, (_, pid) in client.run(_rss_and_pid).items()}
        t1 = time.perf_counter()
        with Watch(client) as watch:
            est.fit(scaled, y)
        seconds = time.perf_counter() - t1
        end_pids = {w: pid for w, (_, pid) in client.run(_rss_and_pid).items()}
    replaced = sorted(set(start_pids.items()) ^ set(end_pids.items()))
    last = est.history_[-1]
    result = {
        "store_gb": X.nbytes / 1e9,
        "memory_limit_gb": args.workers * limit / 1e9,
        "iterations": est.n_iter_,
        "epochs": last.get("epoch"),
        "seconds": seconds,
        "val_accuracy": last.get("val_accuracy"),
        "peak_rss_mb": {w: round(v / 1e6) for w, v in watch.peak.items()},
        "workers_replaced": replaced,
        "data": est.data_,
    }
    print(
        f"one epoch streamed: {est.n_iter_} iterations of 256 in {seconds:.0f} s ({est.data_}); "
        f"held-out accuracy {last.get('val_accuracy')}; peak worker RSS "
        + ", ".join(f"{v / 1e6:.0f} MB" for v in watch.peak.values())
        + f" (limit {limit / 1e6:.0f} MB each); workers replaced: {len(replaced) // 2}",
        flush=True,
    )
    if not args.keep:
        shutil.rmtree(where, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
