"""`dasknn train` writes the model into its run folder; `dasknn predict --model DIR` scores a dataset
or writes predictions, with the documented exit codes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tests.test_bad_input import cli  # the in-process run: exit status and stderr
from tests.test_cli import dasknn

TRAIN = ("train", "--dataset", "digits", "--engine", "simulated", "--n-workers", "1", "--n-groups", "1",
         "--lr", "0.01", "--momentum", "0.9", "--max-epochs", "0.5", "--eval-size", "200", "-q")  # fmt: skip


def test_train_writes_the_model_and_predict_scores_and_writes_predictions(tmp_path):
    run = tmp_path / "run"
    out = dasknn(*TRAIN, "--target-accuracy", "0.5", "--output", str(run))
    assert out.returncode == 0, out.stderr
    assert (run / "model" / "model.json").is_file() and "model" in out.stdout
    scored = dasknn("predict", "--model", str(run / "model"), "--dataset", "digits")
    assert scored.returncode == 0, scored.stderr
    line = next(x for x in scored.stdout.splitlines() if x.startswith("accuracy"))
    accuracy = float(line.split()[1].rstrip("%")) / 100
    assert 0.5 <= accuracy <= 1.0
    csv = tmp_path / "pred.csv"
    code, err = cli("predict", "--model", str(run / "model"), "--dataset", "digits", "--output", str(csv))
    assert code == 0, err
    table = pd.read_csv(csv)
    assert list(table.columns[:2]) == ["index", "prediction"] and len(table) == 1797
    assert set(table["prediction"]) <= set(range(10))
    npy = tmp_path / "pred.npy"
    code, err = cli("predict", "--model", str(run / "model"), "--dataset", "digits", "--output", str(npy))
    assert code == 0, err
    np.testing.assert_array_equal(np.load(npy, allow_pickle=False), table["prediction"].to_numpy())


def test_predict_refuses_a_missing_model_or_output_format_with_exit_2(tmp_path):
    code, err = cli("predict", "--model", str(tmp_path / "nothing"), "--dataset", "digits")
    assert code == 2 and "nothing" in err and "not a saved DistributedCNN" in err
    code, err = cli("predict", "--model", str(tmp_path), "--dataset", "digits", "--output", "x.parquet")
    assert code == 2 and ".csv or .npy" in err
