"""`dasknn train`: DistributedCNN on a LocalCluster sized to the machine (or on a running
scheduler), the tuner choosing n_groups, learning rate and momentum unless they are given; the
run's files and report go to an output folder (`report.write_run`)."""

from __future__ import annotations

import argparse
import logging
import os
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path

from dasknn import __version__
from dasknn.cli.datasets import DATASETS, add_dataset_flags, dataset_options, default_dataset, load_dataset
from dasknn.cli.exits import EXIT_BUDGET_OUT, EXIT_TARGET_REACHED
from dasknn.cli.options import positive
from dasknn.cli.report import import_plot_ahead, write_run
from dasknn.estimator_params import BY_NAME, add_flags, flag_values
from dasknn.written import check_writable, new_folder

logger = logging.getLogger(__name__)


def run(args) -> int:
    """Train a net with DistributedCNN and report time to accuracy.

    Where the fit would start a LocalCluster, the command starts it first, on a thread
    (`cluster.ClusterAhead`), as soon as the options are checked: the fork server its workers come
    from, the scheduler and the workers start while the command reads the data and imports the
    estimator (and, while it then waits for them, the plot's modules: `import_plot_ahead`, done
    before the fit begins), and the fit uses it as its default client; it closes on a thread while
    the report is written, and on every way out of the block (a dataset that fails to load: the
    cluster closes, then the one line and exit 2)."""
    from dasknn.backend import describe_device
    from dasknn.cluster import ClusterAhead, announce
    from dasknn.estimator_params import check_params, defaults

    args.dataset = args.dataset or default_dataset()
    stamp = f"{datetime.now():%Y%m%d-%H%M%S}-{Path(args.net).stem}-{args.dataset}"
    out = Path(args.output or Path("dasknn-runs") / stamp)
    check_writable(nearest_folder(out))
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
    dataset_options(args, args.dataset)
    ahead = ClusterAhead.wanted(params["scheduler"], params["engine"], params["security"])
    with ClusterAhead(params["n_workers"]) if ahead else nullcontext() as cluster:
        X, y = load_dataset(args)
        from dasknn.engine.trace import time_unit
        from dasknn.estimator import DistributedCNN

        est = DistributedCNN(**params)
        knobs = f"n_groups={args.n_groups}, learning_rate={args.learning_rate}, momentum={args.momentum}"
        logger.info(
            f"dasknn {__version__}: {args.net} on {args.dataset} {tuple(X.shape)}, batch {args.batch_size}, "
            f"{knobs}, engine {args.engine}, budget {args.time_budget} {time_unit(args.engine)}"
        )
        logger.info(f"device: {describe_device()}")
        logger.info(f"held out: {held_out}")
        plot_import = None
        if cluster is not None:
            if not cluster.ready():
                plot_import = import_plot_ahead()
            announce(cluster.client())
        import dask
        import distributed  # noqa: F401  (defines the config key below; a simulated fit may not import it)

        if plot_import is not None:
            plot_import.join()
        with dask.config.set({"distributed.comm.timeouts.connect": f"{args.connect_timeout:g}s"}):
            est.fit(X, y)
        if cluster is not None:
            cluster.close_behind()
        with new_folder(out):
            best = write_run(est, args, out, held_out)
    target = args.target_accuracy
    return EXIT_TARGET_REACHED if target is None or best >= target else EXIT_BUDGET_OUT


def nearest_folder(path: Path) -> Path:
    """`path`, or its nearest parent that exists: where a command creates the folders it writes."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


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
        X_test, y_test = load_dataset(args, split="test")
        return (X_test, y_test), None, f"the {args.dataset} test split ({X_test.shape[0]} samples)"
    fraction = 0.2 if args.validation_fraction is None else args.validation_fraction
    if fraction == 0:
        return None, None, "nothing (--validation-fraction 0): accuracies are on training samples"
    return None, fraction, f"{fraction:.0%} of {args.dataset}, stratified, never trained on"


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


def _output(text: str) -> str:
    """An argparse type: a folder that exists or can be created (checked before any training; one
    in a folder that cannot be written: exit 5, local I/O)."""
    path = Path(text).resolve()
    parent = nearest_folder(path)
    if (path.exists() and not path.is_dir()) or not parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"cannot create the output folder {text!r} ({parent} is not a folder)"
        )
    return text


def add_parser(sub, parents: list[argparse.ArgumentParser]) -> None:
    """`dasknn train`'s options: the estimator's parameters (from the table of parameters,
    `estimator_params.add_flags`), then the command's own: the dataset, TLS files, the output."""
    t = sub.add_parser("train", help="train a CNN and report time to accuracy", parents=parents)
    add_flags(t)
    add_dataset_flags(t)
    t.add_argument(
        "--lr-grid",
        type=_lr_grid,
        default=None,
        help="--tuner grid: the cold-start rates, highest first, e.g. 0.1,0.03,0.01 (default: 0.1 ... 1e-5)",
    )
    t.add_argument(
        "--connect-timeout",
        type=positive(float),
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
        help="more messages on stderr: -v a line per evaluation and the tuner's decisions, -vv its "
        "probes too",
    )
    t.set_defaults(func=run, verbose=1)  # one default for -q and -v, which share the dest
