"""Run an experiment at its tiny setting, into a temporary folder, and load what it wrote."""

from __future__ import annotations

import importlib

import pytest

from dasknn.tradeoff.record import load


@pytest.fixture
def run_tiny(tmp_path):
    """run_tiny(name, *options) -> (Dataset read back from NAME.nc, the folder); checks the files."""

    def run(name: str, *options: str):
        module = importlib.import_module(f"experiments.{name}")
        out = tmp_path / name
        assert module.main(["--tiny", "--out", str(out), *options]) == 0
        for written in (f"{name}.nc", f"{name}.png", "table.md"):
            assert (out / written).stat().st_size > 0, f"{name} did not write {written}"
        ds = load(out / f"{name}.nc")
        missing = set(module.VARIABLES) - set(ds.data_vars)
        assert not missing, f"{name}'s Dataset lacks its documented variables {sorted(missing)}"
        assert ds.attrs["experiment"] == name and ds.attrs["setting"] == "tiny"
        assert ds.attrs["mirrors"] == module.MIRRORS
        return ds, out

    return run
