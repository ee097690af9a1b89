"""`dasknn experiment`: run one of the papers' experiments in miniature, from the `experiments/`
scripts of dasknn's source checkout (they are not part of the installed package)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub, parents: list[argparse.ArgumentParser]) -> None:
    """`dasknn experiment`'s options: where the experiments are, their name and their own options."""
    e = sub.add_parser(
        "experiment",
        parents=parents,
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
    e.set_defaults(func=run)


def run(args) -> int:
    """Run one of the papers' experiments in miniature (experiments/README.md lists them)."""
    import importlib

    package = experiments_package(from_cwd=args.from_cwd)
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


def experiments_package(from_cwd: bool = False):
    """The `experiments` package of dasknn's source checkout (with `from_cwd`, the current
    directory's), imported from that folder whatever sys.path holds. The current directory is
    never searched unless asked: its `experiments/__init__.py` would run with the user's rights."""
    import importlib.util

    root = Path.cwd() if from_cwd else Path(__file__).resolve().parents[2]
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
