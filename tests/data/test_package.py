"""dasknn.data's names import on first use: a worker's task function does not load the loaders or zarr."""

from __future__ import annotations

import subprocess
import sys

import dasknn.data


def test_every_public_name_resolves_and_all_lists_them():
    assert sorted(dasknn.data.__all__) == sorted(dasknn.data._WHERE)
    for name in dasknn.data.__all__:
        assert getattr(dasknn.data, name) is not None
    assert dasknn.data.store.data_home is dasknn.data.data_home


def test_a_task_functions_module_loads_neither_the_loaders_nor_zarr():
    code = (
        "import sys, dasknn.data.chunks, dasknn.data.augment; "
        "print(sorted(m for m in ('zarr', 'dasknn.data.registry', 'dasknn.data.loaders', "
        "'dasknn.data.formats') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
