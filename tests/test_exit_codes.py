"""`dasknn` exits by the cause of a failure, in one line on stderr: a fit that diverges (exit 6,
naming the likely causes), a full disk under what a command writes (exit 5, naming the file, no
partial file left), a TLS file that holds no PEM (exit 2, naming the file, before connecting).
Each runs the command in this process on the simulated engine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.cli.exits import EXIT_BAD_INPUT, EXIT_CLUSTER_FAILURE, EXIT_DIVERGED, EXIT_LOCAL_IO
from dasknn.data.store import write_store
from tests.test_bad_input import cli

TRACEBACK = "Traceback (most recent call last)"
TINY = ["--engine", "simulated", "--net", "mlp", "--n-groups", "1", "--lr", "0.01", "--momentum", "0.9"]
TINY += ["--eval-size", "64", "--n-workers", "1", "-q"]
ON_DASK = [
    "--dataset",
    "digits",
    "--engine",
    "dask",
    "--n-groups",
    "1",
    "--lr",
    "0.01",
    "--momentum",
    "0.9",
    "-q",
]


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


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    """The model folder of a tiny `dasknn train` run (an MLP on digits, 0.3 epochs)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    code, err = cli("train", "--dataset", "digits", *TINY, "--max-epochs", "0.3", "--output", str(run))
    assert code in (0, 1), err
    return run / "model"


def mounted(where: Path, *options: str):
    """A 64 KiB tmpfs mounted at `where` (with `options`); skips where mounting is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(["size=64k", *options]), "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def unmount(where: Path) -> None:
    """Unmount `where`; lazily where a file stays open on it (HDF5 keeps the netCDF file it failed
    to write open until the process ends)."""
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "--lazy", str(where)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    """An empty file system of 64 KiB."""
    where = tmp_path / "small"
    mounted(where)
    try:
        yield where
    finally:
        unmount(where)


def fill(folder: Path, leave: int = 0) -> None:
    """Fill `folder`'s file system with one file, leaving `leave` KiB of it free."""
    with open(folder / "filler", "wb", buffering=0) as filler:
        with pytest.raises(OSError, match="No space left"):
            while True:
                filler.write(b"\\0" * 4096)
    if leave:
        os.truncate(folder / "filler", (folder / "filler").stat().st_size - leave * 1024)


@pytest.fixture
def full_disk(small_disk):
    """A file system of 64 KiB with no space left."""
    fill(small_disk)
    yield small_disk


@pytest.fixture
def read_only(tmp_path):
    where = tmp_path / "read-only"
    mounted(where, "ro")
    try:
        yield where
    finally:
        unmount(where)


def left_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("name", ["pred.csv", "pred.npy"])
def test_predictions_to_a_full_disk_exit_5_naming_the_file_and_leave_nothing(saved_model, full_disk, name):
    out = full_disk / name
    code, err = cli("predict", "--model", str(saved_model), "--dataset", "digits", "--output", str(out))
    assert code == EXIT_LOCAL_IO == 5, err
    (line,) = lines(err)
    assert line.startswith("dasknn predict: local I/O failure: No space left on device: " + str(out)), line
    assert left_in(full_disk) == ["filler"]


def test_a_run_folder_on_a_full_disk_exits_5_naming_the_file_and_leaves_nothing(full_disk):
    run = full_disk / "run"
    code, err = cli("train", "--dataset", "digits", *TINY, "--max-epochs", "0.3", "--output", str(run))
    assert code == EXIT_LOCAL_IO == 5, err
    line = lines(err)[-1]
    assert line.startswith(f"dasknn train: local I/O failure: No space left on device: {run}/history.csv;"), (
        line
    )
    assert "cluster" not in line and TRACEBACK not in err
    assert left_in(full_disk) == ["filler"]  # the run folder it created, empty, is removed too


@pytest.mark.parametrize(
    "room, fails",
    [(16, "experiment.nc"), (64, "model")],  # netCDF's error on a full disk is EACCES: named as full
)
def test_a_run_folder_that_fills_the_disk_midway_leaves_only_complete_files(small_disk, room, fails):
    if room < 64:
        fill(small_disk, leave=room)
    run = small_disk / "run"
    code, err = cli("train", "--dataset", "digits", *TINY, "--max-epochs", "0.3", "--output", str(run))
    assert code == EXIT_LOCAL_IO == 5, err
    line = lines(err)[-1]
    assert line.startswith(f"dasknn train: local I/O failure: No space left on device: {run / fails};"), line
    assert not (run / fails).exists()
    kept = left_in(small_disk)
    assert {"run/history.csv", "run/report.csv", "run/trace.csv"} <= set(kept), kept  # written whole
    assert not [k for k in kept if "/." in k]  # no temporary file or folder left


def test_outputs_into_a_read_only_folder_exit_5_before_any_work(saved_model, read_only):
    out = read_only / "pred.csv"
    code, err = cli("predict", "--model", str(saved_model), "--dataset", "digits", "--output", str(out))
    assert code == EXIT_LOCAL_IO, err
    (line,) = lines(err)
    assert line.startswith(f"dasknn predict: local I/O failure: Read-only file system: {read_only};"), line
    code, err = cli("train", "--dataset", "digits", *TINY, "--output", str(read_only / "run"))
    assert code == EXIT_LOCAL_IO, err
    assert lines(err)[-1].startswith(f"dasknn train: local I/O failure: Read-only file system: {read_only};")
    code, err = cli("export", "--model", str(saved_model), "--output", str(read_only / "m.onnx"))
    assert code == EXIT_LOCAL_IO, err
    assert lines(err)[-1].startswith(f"dasknn export: local I/O failure: Read-only file system: {read_only};")


@pytest.fixture(scope="module")
def pem_files(tmp_path_factory) -> dict[str, Path]:
    """A throwaway CA certificate, client certificate and key (`Security.temporary()`) as files."""
    from distributed.security import Security

    made = Security.temporary()
    where = tmp_path_factory.mktemp("tls")
    files = {"ca": made.tls_ca_file, "cert": made.tls_client_cert, "key": made.tls_client_key}
    for name, text in files.items():
        (where / f"{name}.pem").write_text(text)
    return {name: where / f"{name}.pem" for name in files}


@pytest.mark.parametrize("bad", ["ca", "cert", "key"])
@pytest.mark.parametrize("content", ["", "garbage\n"])
def test_a_tls_file_that_holds_no_pem_exits_2_naming_it_before_connecting(pem_files, tmp_path, bad, content):
    broken = tmp_path / f"broken-{bad}.pem"
    broken.write_text(content)
    files = {**pem_files, bad: broken}
    flags = [
        "--tls-ca-file",
        str(files["ca"]),
        "--tls-cert",
        str(files["cert"]),
        "--tls-key",
        str(files["key"]),
    ]
    scheduler = "tls://127.0.0.1:9"  # nothing listens: a check made after connecting would fail there
    code, err = cli("train", *ON_DASK, "--scheduler", scheduler, *flags)
    (line,) = lines(err)
    assert code == EXIT_BAD_INPUT, err
    assert line.startswith(f"dasknn train: error: --tls-{'ca-file' if bad == 'ca' else bad} {broken}: "), line
    assert "cluster" not in line


def test_working_tls_files_pass_the_check_and_reach_the_scheduler(pem_files):
    flags = ["--tls-ca-file", str(pem_files["ca"]), "--tls-cert", str(pem_files["cert"])]
    scheduler = "tls://127.0.0.1:9"
    code, err = cli("train", *ON_DASK, "--scheduler", scheduler, *flags,
                    "--tls-key", str(pem_files["key"]), "--connect-timeout", "1")  # fmt: skip
    assert code == EXIT_CLUSTER_FAILURE, err  # the files were read: the connection is what failed
    assert "cannot reach the scheduler" in lines(err)[-1]


@pytest.mark.parametrize("name", ["X", "y"])
def test_a_store_without_its_x_or_y_exits_2_naming_the_store_and_the_array(tmp_path, name):
    X, y = np.random.default_rng(0).random((100, 1, 8, 8), dtype=np.float32), np.arange(100) % 3
    store = write_store(
        da.from_array(X, chunks=50), da.from_array(y, chunks=50), tmp_path / "s.zarr", attrs={"unit_max": 1.0}
    )
    shutil.rmtree(store / name)
    code, err = cli("train", "--dataset", "zarr", "--data-dir", str(store), *TINY)
    assert code == EXIT_BAD_INPUT, err
    (line,) = lines(err)
    assert line.startswith(f"dasknn train: error: {store}: no array {name!r} in the store"), line


def test_a_bare_key_is_named_as_missing_not_printed_alone():
    from dasknn.cli.exits import failure

    code, line = failure(KeyError("a5"))
    assert line.startswith("error: missing 'a5'"), line
    assert failure(KeyError("no array 'X' in the store"))[1] == "error: no array 'X' in the store"


def test_every_exit_code_is_said_once_in_the_help_and_each_command_module_adds_its_parser():
    """The exit codes live in `cli.exits`: each has its meaning there, which `dasknn --help` lists
    in order; every command of the parser is a module of `dasknn.cli` with `add_parser` and `run`."""
    from dasknn.cli import build_parser, exits
    from dasknn.cli.app import COMMANDS

    codes = {v for k, v in vars(exits).items() if k.startswith("EXIT_")}
    assert set(exits.MEANINGS) == codes and len(codes) == 9
    epilog = " ".join(build_parser().epilog.split())
    assert epilog == "exit codes: " + ", ".join(f"{c} {m}" for c, m in exits.MEANINGS.items())
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert list(commands) == [m.__name__.rsplit(".", 1)[1] for m in COMMANDS]
    for module in COMMANDS:
        assert commands[module.__name__.rsplit(".", 1)[1]].get_default("func") is module.run
