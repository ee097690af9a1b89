"""`dasknn` exits by the cause of a failure, in one line on stderr: a fit that diverges (exit 6,
naming the likely causes), a full disk under what a command writes (exit 5, naming the file, no
partial file left), a TLS file that holds no PEM (exit 2, naming the file, before connecting).
Each runs the command in this process on the simulated engine."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.cli import EXIT_DIVERGED
from dasknn.data.store import write_store
from tests.test_bad_input import cli

TRACEBACK = "Traceback (most recent call last)"
TINY = ["--engine", "simulated", "--net", "mlp", "--n-groups", "1", "--lr", "0.01", "--momentum", "0.9"]
TINY += ["--eval-size", "64", "--n-workers", "1", "-q"]


def lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def digits_store(tmp_path_factory):
    """Digits (1×8×8, in [0, 1]) as a converted store, with every sample past the first batch
    scaled to 3e37: the checks on the first batch pass, and training overflows at any rate."""
    d = load_digits()
    X = (d.data.astype(np.float32) / 16).reshape(-1, 1, 8, 8)
    X[64:] *= np.float32(3e37)
    path = tmp_path_factory.mktemp("stores") / "scaled.zarr"
    return write_store(
        da.from_array(X, chunks=64), da.from_array(d.target, chunks=64), path, attrs={"unit_max": 1.0}
    )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_fit_that_diverges_exits_6_naming_the_likely_causes(digits_store, tmp_path):
    run = tmp_path / "run"
    data = ["--dataset", "zarr", "--data-dir", str(digits_store)]
    code, err = cli("train", *data, *TINY, "--output", str(run))
    last = lines(err)[-1]
    assert code == EXIT_DIVERGED == 6, err
    assert last.startswith("dasknn train: training diverged "), last
    assert "diverged 7 times in a row" in last  # the loop's own words, kept
    assert "scale" in last and "learning rate" in last and "internal error" not in last
    assert TRACEBACK not in err
    assert not run.exists()  # nothing written for a fit that ended in divergence
