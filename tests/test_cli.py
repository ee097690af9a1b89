"""The `dasknn` command, run as a user runs it: a real process, real files (bad options past the
first are checked in this process, which exits the same way without a second interpreter)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from tests.conftest import REPO
from tests.test_bad_input import cli  # the in-process run: exit status and stderr


def dasknn(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "dasknn", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_train_with_fixed_knobs_reaches_its_target_and_writes_the_report(tmp_path):
    run = tmp_path / "run"
    out = dasknn(
        "train", "--dataset", "digits", "--target-accuracy", "0.9", "--time-budget", "90",
        "--n-groups", "1", "--lr", "0.01", "--momentum", "0.9", "--n-workers", "1",
        "--eval-size", "500", "--output", str(run), "-q",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "time to held-out accuracy (20% of digits" in out.stdout
    assert "iterations (" in out.stdout and "search time included" not in out.stdout  # fixed knobs: no search
    assert "time to training accuracy" in out.stdout
    report = pd.read_csv(run / "report.csv")
    assert list(report["threshold"]) == [0.9, 0.95, 0.98, 0.99] * 2
    assert list(report["metric"]) == ["val_accuracy"] * 4 + ["accuracy"] * 4
    assert bool(report.loc[0, "reached"]) and report.loc[0, "seconds"] > 0
    history = pd.read_csv(run / "history.csv")
    assert history["val_accuracy"].max() >= 0.9 and history["iteration"].is_monotonic_increasing
    assert out.stderr.count("[dasknn] started a LocalCluster") == 0  # -q: silent
    assert "ERROR" not in out.stderr and "WARNING" not in out.stderr  # the cluster closed quietly
    assert (run / "accuracy.png").stat().st_size > 1000
    trace = pd.read_csv(run / "trace.csv")
    # the model's iterations; those trained while its last evaluation scored it are "discarded"
    model = trace[trace["phase"] != "discarded"]
    assert len(model) == history["iteration"].iloc[-1] and (trace["staleness"] == 0).all()
    assert trace.loc[trace["phase"] == "discarded", "iteration"].gt(len(model)).all()
    with xr.open_dataset(run / "experiment.nc") as ds:
        assert ds.attrs["engine"] == "dask" and "P_HE" in ds and ds.attrs["dataset"] == "digits"


def test_bad_options_exit_2_with_the_problem_named(tmp_path):
    out = dasknn("train", "--net", "vgg", "--dataset", "digits", "--output", str(tmp_path / "x"), "-q")
    assert out.returncode == 2 and "unknown net 'vgg'" in out.stderr  # the process's own exit code
    code, err = cli("train", "--dataset", "imagenet", "-q")
    assert code == 2 and "imagenet" in err
    code, err = cli("train", "--batch-size", "0")
    assert code == 2 and "batch_size must be an integer >= 1, got 0" in err
    code, err = cli("train", "--lr", "fast")
    assert code == 2 and "learning_rate must be 'auto' or a finite number > 0, got 'fast'" in err
    code, err = cli("train", "--lr-grid", "0.1,-0.01")
    assert code == 2 and "--lr-grid" in err
    assert "lr_grid must be a non-empty list, each item a finite number > 0, got (0.1, -0.01)" in err
    code, err = cli(
        "train", "--dataset", "digits", "--val-split", "test", "-q", "--output", str(tmp_path / "v")
    )
    assert code == 2 and "--val-split test needs a dataset with a test split" in err
    code, err = cli("train", "--validation-fraction", "1")
    assert code == 2 and "--validation-fraction" in err


def test_summary_prints_layers_and_costs():
    out = dasknn("summary", "lenet")
    assert out.returncode == 0
    assert "431,080 parameters" in out.stdout and "conv1" in out.stdout and "flops" in out.stdout
    # the net's line, then its table: no layer's raw fields (Filler(type=..., value=..., ...))
    title, header = out.stdout.splitlines()[:2]
    assert title == "Net('LeNet', input_shape=(1, 28, 28), 431,080 parameters)" and "flops" in header
    assert "Filler" not in out.stdout


@pytest.mark.slow
def test_train_with_a_replica_strategy_on_the_simulator(tmp_path):
    """--strategy / --physical-map reach the engine; simulated seconds are labelled as such."""
    run = tmp_path / "sma"
    out = dasknn(
        "train", "--dataset", "digits", "--engine", "simulated", "--strategy", "sma",
        "--n-groups", "2", "--lr", "0.05", "--momentum", "0.9", "--max-epochs", "4",
        "--target-accuracy", "0.5", "--eval-size", "300", "--output", str(run), "-q",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "simulated s" in out.stdout
    trace = pd.read_csv(run / "trace.csv")
    assert set(trace["group"]) == {0, 1}
    code, err = cli("train", "--strategy", "hogwild")
    assert code == 2 and "--strategy" in err


@pytest.mark.slow
def test_lr_grid_sets_the_optimizers_cold_start_rates(tmp_path):
    run = tmp_path / "grid"
    out = dasknn(
        "train", "--dataset", "digits", "--engine", "simulated", "--tuner", "grid", "--lr-grid", "0.05,0.005",
        "--max-epochs", "2", "--eval-size", "300", "--output", str(run), "-q",
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    decisions = pd.read_csv(run / "decisions.csv")
    cold = decisions[(decisions["phase"] == "cold_start") & (decisions["action"] == "probe")]
    assert cold["lr"].iloc[0] == 0.05 and set(cold[cold["n_groups"] == 1]["lr"]) <= {0.05, 0.005}
    # the printed decisions (whether or not the target was reached): the main columns and the
    # whole reasons, one line each
    table = out.stdout.split("tuner decisions (every column in decisions.csv):\n")[1]
    lines = table.split("\n\n")[0].splitlines()
    assert lines[0].split()[:3] == ["phase", "action", "n_groups"] and "start_hash" not in lines[0]
    assert len(lines) == len(decisions) + 1 and "cold-start rate 1 of 2" in lines[1]
    reasons = decisions["reason"].fillna("").astype(str)
    assert all(line.rstrip().endswith(r) for line, r in zip(lines[1:], reasons, strict=True))
    assert "NaN" not in table.split("\n\n")[0]  # a column empty in every row is left out


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`dasknn ... | head`: the pipe closes before dasknn writes; it exits 1 without a traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dasknn", "summary", "lenet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    proc.stdout.close()  # before the interpreter has even imported dasknn
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err.decode()
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()


def test_val_split_test_holds_out_the_datasets_test_split(tmp_path):
    from tests.data.files import write_mnist

    write_mnist(tmp_path / "mnist", n_train=128, n_test=64)
    run = tmp_path / "run"
    out = dasknn(
        "train", "--dataset", "mnist", "--data-dir", str(tmp_path / "mnist"), "--val-split", "test",
        "--engine", "simulated", "--n-groups", "1", "--lr", "0.01", "--momentum", "0.9", "--max-epochs", "1",
        "--target-accuracy", "0.999", "--eval-size", "64", "--output", str(run),
    )  # fmt: skip
    assert out.returncode == 1, out.stderr  # random images: the target is not reached, a clean exit
    assert "[dasknn] held out: the mnist test split (64 samples)" in out.stderr  # a message, not output
    assert "dasknn (simulated):" in out.stderr and "/240 sim s" in out.stderr  # the bar over the budget
    history = pd.read_csv(run / "history.csv")
    assert history["val_accuracy"].notna().all() and len(history) >= 2
    # every held-out accuracy is a count of the 64 test samples
    assert np.allclose(history["val_accuracy"] * 64, np.round(history["val_accuracy"] * 64))


@pytest.mark.slow
def test_train_streams_and_augments_on_the_workers(tmp_path):
    out = dasknn(
        "train", "--dataset", "digits", "--data", "stream", "--augment", "shift", "--shuffle-window", "2",
        "--n-groups", "2", "--lr", "0.01", "--momentum", "0.9", "--n-workers", "2", "--max-epochs", "2",
        "--time-budget", "200", "--eval-size", "300", "--output", str(tmp_path / "s"), "-q",
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    assert "data: stream (read from storage by the workers, batch by batch)" in out.stdout
    assert "augmented on the workers: Augment(crop_size=None, mirror=False, shift=2)" in out.stdout
    history = pd.read_csv(tmp_path / "s" / "history.csv")
    assert history["epoch"].iloc[-1] >= 1.9 and history["accuracy"].iloc[-1] > 0.5
    code, err = cli("train", "--dataset", "digits", "--augment", "rotate", "-q", "--output", str(tmp_path))
    assert code == 2 and "augment must be None, 'shift'" in err
    code, err = cli("train", "--data", "stream", "--engine", "simulated", "-q", "--output", str(tmp_path))
    assert code == 2 and "data='stream' needs engine='dask'" in err


END_PROCESS = """
import atexit, sys, threading, time
from dasknn.cli.exits import end_process
atexit.register(lambda: print("atexit ran", flush=True))
if sys.argv[1] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
print("written before the end", end="")  # left in stdout's buffer: the fast end must flush it
end_process(3)
print(" / normal exit")
"""


def test_a_finished_command_ends_its_process_at_once_unless_something_still_runs():
    fast = subprocess.run([sys.executable, "-c", END_PROCESS, "alone"], capture_output=True, text=True)
    assert fast.returncode == 3 and fast.stdout == "written before the end"  # no teardown, no atexit
    busy = subprocess.run([sys.executable, "-c", END_PROCESS, "thread"], capture_output=True, text=True)
    assert busy.returncode == 0  # a thread still ran: the normal exit, which waits for it
    lines = ["written before the end / normal exit", "thread finished", "atexit ran", ""]
    assert busy.stdout.split("\n") == lines


def test_max_wall_time_none_is_read_in_any_case():
    from dasknn.cli.app import build_parser

    for word in ("none", "None", "NONE"):
        assert build_parser().parse_args(["train", "--max-wall-time", word]).max_wall_time is None
    assert build_parser().parse_args(["train", "--max-wall-time", "30"]).max_wall_time == 30


def test_the_final_line_counts_a_search_only_when_a_tuner_searched(capsys):
    import pandas as pd

    from dasknn.cli.report import _print_final

    row = {"time": 3.0, "iteration": 90, "epoch": 1.5, "accuracy": 0.9, "val_accuracy": 0.8}
    history = pd.DataFrame([row])
    assert _print_final(history, "s", searched=True) == "val_accuracy"
    assert capsys.readouterr().out.strip().endswith("90 iterations (1.5 epochs), search time included")
    _print_final(history, "s", searched=False)
    assert capsys.readouterr().out.strip().endswith("90 iterations (1.5 epochs)")
