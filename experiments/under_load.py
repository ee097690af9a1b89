"""The default test suite on a loaded machine: two CPU-bound processes run beside it the whole time.

Usage: `python -m experiments.under_load [--hogs 2] [pytest arguments ...]`. Starts `--hogs` real
`python -c "while True: pass"` processes, runs `python -m pytest -q` (the default markers, or the
arguments given) in this checkout, kills the hogs whatever happens, and prints the suite's result,
its wall time and the load average seen. Tests must not depend on machine speed or load; this
script is how that is checked. Its exit code is pytest's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=2, help="CPU-bound processes beside the suite")
    args, pytest_args = parser.parse_known_args(argv)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    loads = [os.getloadavg()[0]]
    t0 = time.monotonic()
    try:
        suite = subprocess.Popen([sys.executable, "-m", "pytest", "-q", *pytest_args], cwd=REPO, env=env)
        while suite.poll() is None:
            loads.append(os.getloadavg()[0])
            if any(h.poll() is not None for h in hogs):
                raise RuntimeError("a CPU hog stopped before the suite ended")
            time.sleep(5)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    seconds = time.monotonic() - t0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"\nunder_load: pytest exit {suite.returncode} in {seconds / 60:.1f} min beside {args.hogs} CPU hogs "
        f"on {cores} cores; 1-min load average median {sorted(loads)[len(loads) // 2]:.1f}, "
        f"max {max(loads):.1f}"
    )
    return suite.returncode


if __name__ == "__main__":
    sys.exit(main())
