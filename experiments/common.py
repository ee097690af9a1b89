"""What every experiment shares: its command line, its results folder, and how its results are written.

An experiment module `experiments/NAME.py` defines

- `NAME`: its name (the module's), `MIRRORS`: the figure/table of the paper it mirrors,
- `VARIABLES`: the data variables its Dataset always holds (the tiny-setting test checks them),
- `run(tiny: bool = False, **options) -> Experiment`: the measurement, returning the Dataset, the
  markdown table and a function drawing the plot,
- `main = common.main_for(run, __doc__)`: `python -m experiments.NAME [--tiny] [--out DIR] [options]`.

`dasknn experiment NAME` runs the same `main`. Results go to `experiments/results/NAME/` (or `--out`):
`NAME.nc` (the Dataset, netCDF-4), `NAME.png` (the plot) and `table.md` (the table under a title).

The benchmarks (`bench_*.py`) and the two HE-model scripts share the rest: `parser` (the command
line from the docstring, with `--quick` and repetitions where they have them), `write_tables` (CSV
results), `save_figure` (the plot style: Agg backend, one figure, tight layout, 110 dpi) and
`machine_line` (the machine and its load, printed with every measurement).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

if __package__ in (None, ""):  # imported from a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn import __version__  # noqa: E402
from dasknn.tradeoff.record import save  # noqa: E402

RESULTS_ROOT = Path(__file__).resolve().parent / "results"


FIGSIZE = (6.4, 4.4)
DPI = 110

#: command-line options several experiments share (`main_for`'s `options`)
NET_OPTION = (("--net",), {"default": "lenet_small", "help": "lenet_small (default) or lenet"})
GROUPS_OPTION = (
    ("--groups",),
    {"type": int, "default": None, "help": "compute groups g (default: the tradeoff experiment's choice)"},
)
ITERATIONS_OPTION = (
    ("--iterations",),
    {"type": int, "default": None, "help": "updates per run (default 300)"},
)
JOBS_OPTION = (
    ("--jobs",),
    {"type": int, "default": 1, "help": "training runs at once, in processes (default 1)"},
)
SEEDS_OPTION = (("--seeds",), {"type": int, "default": None, "help": "seeds per configuration (default 3)"})


@dataclass
class Experiment:
    """One experiment's outcome: its Dataset, a markdown table, and how to plot it."""

    dataset: xr.Dataset
    table: str
    plot: Callable[[xr.Dataset, Any], None]
    notes: list[str] = field(default_factory=list)
    figsize: tuple[float, float] = FIGSIZE


def results_dir(name: str, out: str | Path | None = None) -> Path:
    """The folder an experiment writes to: `out`, or experiments/results/NAME."""
    path = Path(out) if out is not None else RESULTS_ROOT / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def markdown_table(df: pd.DataFrame, floatfmt: str = ".3g") -> str:
    """A GitHub markdown table of a DataFrame (no extra dependency), floats with `floatfmt`."""

    def cell(v: Any) -> str:
        if isinstance(v, float | np.floating):
            return "–" if not math.isfinite(v) else format(float(v), floatfmt)
        return str(v)

    header = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def stamp(ds: xr.Dataset, name: str, mirrors: str, tiny: bool, **attrs: Any) -> xr.Dataset:
    """Set the attrs every experiment Dataset carries (name, paper figure, setting, version, device)."""
    from dasknn.backend import device_info

    ds.attrs.update(
        {
            "experiment": name,
            "mirrors": mirrors,
            "setting": "tiny" if tiny else "default",
            "dasknn_version": __version__,
            "device": ", ".join(f"{k} {v}" for k, v in device_info().items()),
            **{k: (str(v) if not isinstance(v, int | float | str) else v) for k, v in attrs.items()},
        }
    )
    return ds


def save_figure(
    draw: Callable[[Any], None], path: str | Path, figsize: tuple[float, float] = FIGSIZE
) -> Path:
    """`draw(fig)` on a new matplotlib figure (Agg backend), laid out tight and saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=figsize)
    try:
        draw(fig)
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    return Path(path)


def write(name: str, result: Experiment, out: str | Path | None = None, title: str = "") -> dict[str, Path]:
    """Write NAME.nc, NAME.png and table.md; returns their paths."""
    folder = results_dir(name, out)
    paths = {"nc": folder / f"{name}.nc", "png": folder / f"{name}.png", "md": folder / "table.md"}
    save(result.dataset, paths["nc"])
    save_figure(lambda fig: result.plot(result.dataset, fig), paths["png"], result.figsize)
    notes = "\n".join(f"- {n}" for n in result.notes)
    setting = result.dataset.attrs.get("setting", "default")
    device = result.dataset.attrs.get("device", "")
    paths["md"].write_text(
        f"# {title or name}\n\nSetting: {setting}. Device: {device}.\n\n{result.table}\n\n{notes}\n".rstrip()
        + "\n"
    )
    return paths


def main_for(
    run: Callable[..., Experiment], doc: str | None, options: Sequence[tuple[Sequence[str], dict]] = ()
) -> Callable[[list[str] | None], int]:
    """A `main(argv)` for an experiment: parses --tiny, --out and its own `options`, runs, writes, prints."""
    name = run.__globals__.get("NAME") or run.__module__.rsplit(".", 1)[-1]
    title = (doc or name).strip().splitlines()[0]

    def main(argv: list[str] | None = None) -> int:
        cli = parser(doc, prog=f"dasknn experiment {name}")
        cli.add_argument("--tiny", action="store_true", help="the smallest setting (seconds; for tests)")
        cli.add_argument("--out", default=None, help=f"results folder (default experiments/results/{name})")
        for flags, kwargs in options:
            cli.add_argument(*flags, **kwargs)
        args = vars(cli.parse_args(argv))
        tiny, out = args.pop("tiny"), args.pop("out")
        t0 = time.perf_counter()
        result = run(tiny=tiny, **args)
        paths = write(name, result, out, title=title)
        print(result.table)
        for note in result.notes:
            print(f"- {note}")
        print(f"{name}: {time.perf_counter() - t0:.1f} s; wrote {', '.join(str(p) for p in paths.values())}")
        return 0

    return main


def parser(
    doc: str | None, prog: str | None = None, quick: str | None = None, reps: tuple[int, int] | None = None
) -> argparse.ArgumentParser:
    """The command line of an experiment or benchmark: the docstring's first line as description and
    the whole docstring as epilog; `quick` adds `--quick` (its help), `reps` (default, quick) `--reps`."""
    cli = argparse.ArgumentParser(
        prog=prog,
        description=(doc or "").strip().splitlines()[0] if doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=doc,
    )
    if quick is not None:
        cli.add_argument("--quick", action="store_true", help=quick)
    if reps is not None:
        cli.add_argument(
            "--reps", type=int, help=f"repetitions per number (default {reps[0]}, quick {reps[1]})"
        )
        cli.set_defaults(reps_default=reps)
    return cli


def repetitions(args: argparse.Namespace) -> int:
    """`--reps` as given, else the default of the setting (`--quick` or not) that `parser` was given."""
    default, quick = args.reps_default
    return args.reps or (quick if getattr(args, "quick", False) else default)


def machine_line() -> str:
    """The machine (`device_info`) and its 1-minute load average: every measurement prints it."""
    import os

    from dasknn.backend import device_info
    from dasknn.nn.onednn import describe_kernels

    info = device_info()
    load = os.getloadavg()[0]
    return (
        f"machine: {info}; kernels: {describe_kernels()}; "
        f"load average (1 min): {load:.2f} on {info['cores']} cores"
    )


def write_tables(folder: str | Path, tables: dict[str, pd.DataFrame], stem: str = "") -> list[Path]:
    """Each table as `folder/{stem}{key}.csv` (no index); prints and returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, table in tables.items():
        paths.append(folder / f"{stem}{key}.csv")
        table.to_csv(paths[-1], index=False)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return paths


def timestamp() -> str:
    """The time now as YYYYmmdd_HHMMSS, for result files that keep earlier runs beside them."""
    from datetime import datetime

    return f"{datetime.now():%Y%m%d_%H%M%S}"
