"""dasknn's messages go through `logging` (the `dasknn` logger hierarchy), never print: `verbose`
maps to a level, and the command line puts a handler on stderr."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

from tests.conftest import REPO
from tests.test_bad_input import cli


def test_verbose_maps_to_logging_levels_and_nothing_is_printed_to_stdout(tmp_path):
    from dasknn.logs import verbose_level

    assert [verbose_level(v) for v in (0, 1, 2, 3)] == [logging.WARNING, logging.INFO, logging.DEBUG, 5]
    script = textwrap.dedent(
        """
        import numpy as np
        from dasknn import DistributedCNN
        from dasknn.data import load
        X, y = load("digits", size=28)
        X, y = np.asarray(X[:256]), np.asarray(y[:256])
        DistributedCNN(engine="simulated", n_workers=1, batch_size=32, max_epochs=0.5, time_budget=None,
                       eval_size=50, n_groups=1, learning_rate=0.01, momentum=0.9, verbose=2).fit(X, y)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""  # messages are not the program's output
    lines = [x for x in out.stderr.splitlines() if x.startswith("[dasknn] t=")]
    assert len(lines) >= 2 and "loss=" in lines[0]


def test_messages_reach_the_users_logging_configuration(caplog):
    import numpy as np

    from dasknn import DistributedCNN
    from dasknn.data import load

    X, y = load("digits", size=28)
    X, y = np.asarray(X[:256]), np.asarray(y[:256])
    with caplog.at_level(1, logger="dasknn"):  # every message, probes included
        DistributedCNN(engine="simulated", n_workers=1, batch_size=32, time_budget=0.2, eval_size=50,
                       verbose=0).fit(X, y)  # fmt: skip
    names = {r.name for r in caplog.records}
    assert {"dasknn.fitting", "dasknn.policy"} <= names  # the loop's evaluations, the optimizer's decisions
    assert any("loss=" in r.getMessage() for r in caplog.records if r.name == "dasknn.fitting")


def test_the_command_line_logs_on_stderr(tmp_path):
    code, err = cli(
        "train", "--dataset", "digits", "--engine", "simulated", "--n-workers", "1", "--n-groups", "1",
        "--lr", "0.01", "--momentum", "0.9", "--max-epochs", "0.3", "--eval-size", "100",
        "--output", str(tmp_path / "run"), "-v",
    )  # fmt: skip
    assert code in (0, 1), err
    assert any(x.startswith("[dasknn] t=") for x in err.splitlines())
    logging.getLogger("dasknn").handlers.clear()  # the in-process command's handler
