"""A checkpoint is data, checked before a fit resumes from it (`dasknn.engine.checkpoint.load`):
its manifest covers state.json and arrays.npz together, and with the hashes recomputed (a forger's
edit) state.json must still hold on its own. One MLP fit on the simulated engine (about 1 s) writes
the checkpoints; each case edits a copy."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.engine import checkpoint, manifest
from dasknn.estimator import DistributedCNN

MLP = {"net": "mlp", "input_shape": "flat", "engine": "simulated", "n_workers": 1, "batch_size": 32,
       "n_groups": 1, "learning_rate": 0.05, "momentum": 0.9, "time_budget": None,
       "eval_size": 200}  # fmt: skip
A6DBD31 = Path(__file__).parent / "fixtures" / "a6dbd31-checkpoints" / "fixed" / "ckpt-000000000056"


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


@pytest.fixture(scope="module")
def written(tmp_path_factory, digits) -> Path:
    directory = tmp_path_factory.mktemp("ckpts")
    DistributedCNN(**MLP, max_epochs=2, checkpoint_dir=directory).fit(*digits)
    first = checkpoint.list_checkpoints(directory)[0]  # after epoch 1: a fit that goes on from it
    assert checkpoint.load(first).meta["loop"].get("finished") is not True
    return first


@pytest.fixture
def ckpt(written, tmp_path) -> Path:
    return Path(shutil.copytree(written, tmp_path / written.name))


def forge(path: Path, change) -> None:
    """`change(doc, arrays)` applied to the checkpoint at `path`, its checksum and manifest recomputed."""
    doc = json.loads((path / "state.json").read_text())
    with np.load(path / "arrays.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(doc, arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    blob = buf.getvalue()
    (path / "arrays.npz").write_bytes(blob)
    doc["arrays_bytes"], doc["arrays_sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    (path / "state.json").write_text(json.dumps(doc))
    if (path / manifest.NAME).exists():
        manifest.write(path, checkpoint.FILES)


def refused(path: Path, *words: str) -> str:
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.load(path)
    message = str(info.value)
    assert str(path) in message and all(w in message for w in words), message
    return message


def test_any_edit_of_state_json_is_refused_as_damaged_or_edited(ckpt):
    text = (ckpt / "state.json").read_text()
    (ckpt / "state.json").write_text(text.replace('"batches_done": ', '"batches_done": 1', 1))
    refused(ckpt, "state.json", "damaged or edited")


def _swap(doc, arrays):
    key = next(iter(doc["params"]))
    doc["params"][key], doc["momentum"][key] = doc["momentum"][key], doc["params"][key]


def test_a_weight_and_its_momentum_swapped_in_state_json_are_refused(ckpt):
    forge(ckpt, _swap)
    refused(ckpt, "order", "edited")


def test_iterations_done_lowered_is_refused_against_the_folder_name_and_the_records(ckpt):
    forge(ckpt, lambda doc, arrays: doc.update(iterations_done=10))
    refused(ckpt, "iterations_done = 10", ckpt.name)
    renamed = ckpt.rename(ckpt.with_name("ckpt-000000000010"))
    refused(renamed, "iterations_done = 10", "history")


def test_momentum_of_another_dtype_than_its_weight_is_refused(ckpt):
    def widen(doc, arrays):
        name = next(iter(doc["momentum"].values()))
        arrays[name] = arrays[name].astype(np.float64)

    forge(ckpt, widen)
    refused(ckpt, "momentum", "dtype")


@pytest.mark.parametrize("version", [0, -1, True, 3, "2", None])
def test_a_format_version_this_dasknn_does_not_read_is_refused(ckpt, version):
    forge(ckpt, lambda doc, arrays: doc.update(version=version))
    refused(ckpt, "version")


def test_a_lowered_version_without_a_manifest_goes_through_the_same_checks(ckpt):
    (ckpt / manifest.NAME).unlink()
    forge(ckpt, lambda doc, arrays: (doc.update(version=1), _swap(doc, arrays)))
    refused(ckpt, "order")


def test_a_version_2_checkpoint_without_its_manifest_is_refused(ckpt):
    (ckpt / manifest.NAME).unlink()
    refused(ckpt, "manifest.json", "missing")


@pytest.mark.parametrize(
    "change",
    [lambda doc, arrays: doc.update(hook="x"), lambda doc, arrays: doc.update(batches_done="57")],
    ids=["unknown field", "count as a string"],
)
def test_unknown_fields_and_mistyped_counts_are_refused(ckpt, change):
    forge(ckpt, change)
    refused(ckpt, "state.json")


def test_deeply_nested_state_json_is_refused_without_a_recursion_error(ckpt):
    text = (
        (ckpt / "state.json")
        .read_text()
        .replace('"meta": {', '"meta": {"x": ' + "[" * 100_000 + "]" * 100_000 + ",", 1)
    )
    (ckpt / "state.json").write_text(text)
    manifest.write(ckpt, checkpoint.FILES)
    refused(ckpt, "nested")


@pytest.mark.parametrize("damage", [b"", b"not a zip", None])
def test_damaged_arrays_of_a_version_1_checkpoint_are_refused_by_name(tmp_path, damage):
    path = Path(shutil.copytree(A6DBD31, tmp_path / A6DBD31.name))
    blob = (path / "arrays.npz").read_bytes()
    (path / "arrays.npz").write_bytes(blob[: len(blob) // 2] if damage is None else damage)
    refused(path, "arrays.npz")


def test_an_a6dbd31_checkpoint_loads_and_its_forged_edit_is_refused(tmp_path):
    assert checkpoint.load(A6DBD31).state.iterations_done == 56
    path = Path(shutil.copytree(A6DBD31, tmp_path / A6DBD31.name))
    forge(path, lambda doc, arrays: doc.update(iterations_done=30))
    refused(path, "iterations_done = 30")


def _classes(values):
    return lambda doc, arrays: arrays.__setitem__(doc["meta"]["classes"]["__array__"], np.asarray(values))


RESUMED = {
    "20 classes for 10 outputs": (_classes(np.arange(20)), "ip1.weight"),
    "every class 5": (_classes(np.full(10, 5)), "not distinct"),
    "n_features_in a string": (lambda doc, arrays: doc["meta"].update(n_features_in="64"), "n_features_in"),
}


@pytest.mark.parametrize("case", sorted(RESUMED))
def test_a_resume_refuses_a_checkpoint_whose_record_contradicts_its_weights_by_name(ckpt, digits, case):
    change, word = RESUMED[case]
    forge(ckpt, change)
    with pytest.raises(checkpoint.CheckpointError, match=word) as info:
        DistributedCNN(**MLP, max_epochs=2, checkpoint_dir=ckpt.parent, resume=True).fit(*digits)
    assert str(ckpt) in str(info.value)
