"""What `dasknn train` writes and prints for a fitted run: the history, report, trace and
decisions tables, the experiment record, the model, the plot, and the time-to-accuracy tables.

pandas and the trace's module are imported when the report is written, not with this module:
`dasknn train` imports it before it starts its cluster, and keeps that way light."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dasknn.written import written

if TYPE_CHECKING:
    import pandas as pd

DATA_WORDS = {
    "persist": "held in the workers' memory",
    "stream": "read from storage by the workers, batch by batch",
}
"""Where the fit kept its data (`DistributedCNN.data_`), in a reader's words."""


PLOT_MODULES = ("matplotlib.figure", "matplotlib.backends.backend_agg")
"""What the run's plot imports (`reports.plot_accuracy` writing a PNG from a bare Figure)."""


def import_plot_ahead():
    """Import `PLOT_MODULES` on a daemon thread, returned: `dasknn train` starts it as it begins
    waiting for its cluster, when a core would otherwise idle, and joins it before the fit, so the
    import never runs beside the training loop and the report's plot finds the modules loaded."""
    import importlib
    import threading

    def load() -> None:
        for name in PLOT_MODULES:
            importlib.import_module(name)

    thread = threading.Thread(target=load, name="dasknn-plot-import", daemon=True)
    thread.start()
    return thread


def write_run(est, args, out: Path, held_out: str) -> float:
    """Write a fitted run's files to `out`, print its decisions, final accuracies and time to
    accuracy; returns the best accuracy it reached (held-out when there is validation data)."""
    import pandas as pd

    from dasknn.engine.trace import SIMULATED_SECONDS
    from dasknn.reports import METRIC_LABELS, plot_accuracy, search_spans
    from dasknn.tradeoff.record import save

    history = pd.DataFrame(est.history_)
    label = f"{args.net} on {args.dataset}"
    _write_table(history, out / "history.csv")
    _write_table(est.report_, out / "report.csv")
    _write_table(est.trace_, out / "trace.csv")
    files = ["history.csv", "report.csv", "trace.csv", "accuracy.png"]
    if len(est.decisions_):
        from dasknn.reports import decisions_table

        _write_table(est.decisions_, out / "decisions.csv")
        files.append("decisions.csv")
        print("\ntuner decisions (every column in decisions.csv):")
        print(decisions_table(est.decisions_))
    if est.tradeoff_ is not None:
        est.tradeoff_.attrs["dataset"] = args.dataset
        with written(out / "experiment.nc") as tmp:
            save(est.tradeoff_, tmp)
        files.append("experiment.nc")
    _save_model(est, out / "model")
    files.append("model/ (dasknn predict --model)")
    with written(out / "run.json") as tmp:
        tmp.write_text(json.dumps({k: v for k, v in vars(args).items() if k != "func"}, indent=2))
    unit = est.report_.attrs["time_unit"]
    searched = "auto" in (est.n_groups, est.learning_rate, est.momentum)  # a tuner's search on the clock
    metric = _print_final(history, unit, searched)
    augmented = f"; augmented on the workers: {est.augment_}" if est.augment_ is not None else ""
    print(f"data: {est.data_} ({DATA_WORDS[est.data_]}){augmented}")
    _print_times(est.report_, held_out)
    with written(out / "accuracy.png") as tmp:
        plot_accuracy(
            {label: history},
            tmp,
            title=f"{label}: {METRIC_LABELS[metric]}",
            simulated=unit == SIMULATED_SECONDS,
            target=args.target_accuracy,
            search={label: search_spans(est.trace_, est.decisions_)},
            decisions={label: est.decisions_},
        )
    print(f"wrote {out}/: {', '.join(files)}")
    return float(history[metric].max())


def _print_final(history: pd.DataFrame, unit: str, searched: bool) -> str:
    """Print the final accuracies, their time in the fit's clock `unit` (`searched`: a tuner's
    search is in that time); returns the metric a target is judged on."""
    metric = "val_accuracy" if "val_accuracy" in history else "accuracy"
    final = history.iloc[-1]
    held = f"held-out accuracy {final['val_accuracy']:.2%}, " if metric == "val_accuracy" else ""
    print(
        f"\nfinal {held}training accuracy {final['accuracy']:.2%} after {final['time']:.1f} "
        f"{unit}, {int(final['iteration'])} iterations ({final['epoch']:.1f} epochs)"
        + (", search time included" if searched else "")
    )
    return metric


def _print_times(report: pd.DataFrame, held_out: str) -> None:
    """Print the time-to-accuracy tables, one per metric of `report`."""
    from dasknn.engine.trace import SIMULATED_SECONDS
    from dasknn.reports import METRIC_LABELS, format_table

    for name in dict.fromkeys(report["metric"]):
        where = held_out if name == "val_accuracy" else "the training iterations' batches"
        rule = "rule: first evaluation at or above the threshold"
        rule += "; seconds are simulated" if report.attrs["time_unit"] == SIMULATED_SECONDS else ""
        print(f"\ntime to {METRIC_LABELS[name]} ({where}; {rule}):")
        rows = report[report["metric"] == name]
        print(format_table(rows, ["threshold", "reached", "seconds", "iterations", "epochs"]))
    sys.stdout.flush()  # the results show before the plot (matplotlib's import and drawing take a while)


def _write_table(table: pd.DataFrame, path: Path) -> None:
    with written(path) as tmp:
        table.to_csv(tmp, index=False)


def _save_model(est, path: Path) -> None:
    """The fitted model into the run folder (`DistributedCNN.save`), replacing an earlier run's once
    the new one is complete: the TLS settings and the held-out split are the run's, not the
    model's, and are not saved."""
    est.set_params(security=None, validation_data=None)
    est.save(path, overwrite=True)  # written beside it, renamed into place; only a model is replaced
