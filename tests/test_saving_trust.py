"""A saved model is data, not instructions (`dasknn.saving`): model.json is checked against its
schema before anything is built, paths, addresses and objects are never restored, and any damaged
or edited model is a SavedModelError naming the file; `dasknn predict` exits 2 on each in one line.

The tampering tests recompute the manifest, as a forger would: the schema must refuse on its own.
One lenet fit on the simulated engine (about 3 s) is saved once and copied for each case.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from dasknn.data import load as load_data
from dasknn.engine import manifest
from dasknn.estimator import DistributedCNN
from dasknn.optimizer import AutoPolicy, OnlinePolicy
from dasknn.saving import FILES, SavedModelError
from tests.test_bad_input import cli

QUICK = {"engine": "simulated", "n_workers": 1, "time_budget": None, "eval_size": 64, "n_groups": 1,
         "learning_rate": 0.01, "momentum": 0.9}  # fmt: skip


@pytest.fixture(scope="module")
def digits():
    X, y = load_data("digits", size=28)
    return np.asarray(X[:256], dtype=np.float32), np.asarray(y[:256])


@pytest.fixture(scope="module")
def saved(tmp_path_factory, digits):
    """A lenet fitted for a quarter epoch and saved: (its folder, the model)."""
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.25, **QUICK).fit(*digits)
    return est.save(tmp_path_factory.mktemp("saved") / "model"), est


@pytest.fixture
def model(saved, tmp_path) -> Path:
    """A fresh copy of the saved model, to damage."""
    return Path(shutil.copytree(saved[0], tmp_path / "model"))


def tamper(path: Path, change) -> None:
    """`change(doc, arrays)` applied to the model at `path`, its manifest recomputed (a forger's)."""
    doc = json.loads((path / "model.json").read_text())
    with np.load(path / "arrays.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(doc, arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    (path / "arrays.npz").write_bytes(buf.getvalue())
    (path / "model.json").write_text(json.dumps(doc))
    if (path / manifest.NAME).exists():
        manifest.write(path, FILES)


def refused(path: Path, *words: str) -> str:
    """The model at `path` is refused by `load` with a SavedModelError naming the folder and `words`,
    and `dasknn predict` exits 2 with one line."""
    with pytest.raises(SavedModelError) as info:
        DistributedCNN.load(path)
    message = str(info.value)
    assert str(path) in message, message
    for word in words:
        assert word in message, message
    code, err = cli("predict", "--model", str(path), "--dataset", "digits")
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(path) in err, err
    return message


def first_weight(doc) -> str:
    return next(iter(doc["fitted"]["net_"]["params"].values()))["__array__"]


def set_weight(value, dtype=None):
    def change(doc, arrays):
        name = first_weight(doc)
        a = arrays[name].astype(dtype) if dtype is not None else arrays[name].copy()
        a.flat[0] = value
        arrays[name] = a

    return change


WEIGHTS = {
    "NaN": (set_weight(np.nan), "not finite"),
    "inf": (set_weight(np.inf), "not finite"),
    "integers": (set_weight(1, np.int64), "int64"),
    "float64 in a float32 net": (set_weight(0.5, np.float64), "float64"),
    "strings": (lambda doc, arrays: arrays.update({first_weight(doc): np.array(["a", "b"])}), "<U1"),
    "complex": (set_weight(1j, np.complex64), "complex64"),
}


@pytest.mark.parametrize("case", sorted(WEIGHTS))
def test_weights_that_are_not_finite_floats_of_the_nets_dtype_are_refused(model, case):
    change, word = WEIGHTS[case]
    tamper(model, change)
    refused(model, "net_", word)


def _layer(doc, name):
    return next(x for x in doc["fitted"]["net_"]["__net__"]["layers"] if x["name"] == name)


SPEC = {
    "object dtype": (lambda doc, a: doc["fitted"]["net_"]["__net__"].update(dtype="|O"), "|O"),
    "max pool changed to average": (
        lambda doc, a: _layer(doc, "pool1")["config"].update(pool="ave"),
        "net_",
    ),
    "unknown layer type": (lambda doc, a: _layer(doc, "pool1").update(type="Exec"), "Exec"),
}


@pytest.mark.parametrize("case", sorted(SPEC))
def test_a_net_spec_that_is_not_the_fitted_net_is_refused(model, case):
    change, word = SPEC[case]
    tamper(model, change)
    refused(model, word)


def _classes(values):
    def change(doc, arrays):
        arrays[doc["fitted"]["classes_"]["__array__"]] = np.asarray(values)

    return change


def _state_weight(doc, arrays):
    name = next(iter(doc["fitted"]["state_"]["__state__"]["params"].values()))["__array__"]
    arrays[name] = arrays[name] + np.float32(0.25)


def _swap_weight_and_momentum(doc, arrays):
    state = doc["fitted"]["state_"]["__state__"]
    a, b = state["params"]["conv1.weight"], state["momentum"]["conv1.weight"]
    state["params"]["conv1.weight"], state["momentum"]["conv1.weight"] = b, a


FITTED = {
    "20 classes for 10 outputs": (_classes(np.arange(20)), "classes_"),
    "every class 5": (_classes(np.full(10, 5)), "classes_"),
    "n_features_in_ wrong": (lambda doc, a: doc["fitted"].update(n_features_in_=100), "n_features_in_"),
    "n_features_in_ a string": (lambda doc, a: doc["fitted"].update(n_features_in_="784"), "n_features_in_"),
    "state_ weights not the net's": (_state_weight, "state_"),
    "weight and momentum names swapped": (_swap_weight_and_momentum, "order"),
    "n_iter_ not the state's": (lambda doc, a: doc["fitted"].update(n_iter_=100), "n_iter_"),
    "unknown fitted attribute": (lambda doc, a: doc["fitted"].update(backdoor_=1), "backdoor_"),
    "unknown parameter": (lambda doc, a: doc["params"].update(exec_hook="x"), "exec_hook"),
    "mistyped parameter": (lambda doc, a: doc["params"].update(batch_size="abc"), "batch_size"),
    "unknown top-level field": (lambda doc, a: doc.update(run="x"), "run"),
    "an array named twice": (
        lambda doc, a: doc["fitted"]["classes_"].update(__array__=first_weight(doc)),
        "order",
    ),
}


@pytest.mark.parametrize("case", sorted(FITTED))
def test_fitted_attributes_and_parameters_that_contradict_the_net_or_the_schema_are_refused(model, case):
    change, word = FITTED[case]
    tamper(model, change)
    refused(model, word)


@pytest.mark.parametrize("version", [0, -5, True, 1.0, "1", None])
def test_a_format_version_that_is_not_a_positive_integer_this_dasknn_reads_is_refused(model, version):
    tamper(model, lambda doc, a: doc.update(version=version))
    refused(model, "version")


def test_a_lowered_version_without_its_manifest_goes_through_the_same_checks(model):
    tamper(model, set_weight(np.nan))
    (model / manifest.NAME).unlink()
    tamper(model, lambda doc, a: doc.update(version=1))
    refused(model, "not finite")


def test_a_version_1_model_has_no_manifest_and_loads_through_the_schema(saved, model, digits):
    (model / manifest.NAME).unlink()
    tamper(model, lambda doc, a: doc.update(version=1))
    loaded = DistributedCNN.load(model)
    np.testing.assert_array_equal(
        loaded.predict_proba(digits[0][:16]), saved[1].predict_proba(digits[0][:16])
    )


def test_a_version_2_model_without_its_manifest_is_refused(model):
    (model / manifest.NAME).unlink()
    refused(model, "manifest.json", "missing")


def test_deeply_nested_json_is_refused_without_a_recursion_error(model):
    nested = "[" * 100_000 + "]" * 100_000
    text = (model / "model.json").read_text().replace('"stopped_by_": ', f'"stopped_by_": {nested}, "x": ', 1)
    (model / "model.json").write_text(text)
    manifest.write(model, FILES)
    refused(model, "nested")


def _flip(path: Path, at: float) -> None:
    blob = bytearray(path.read_bytes())
    blob[int(len(blob) * at)] ^= 0x10
    path.write_bytes(bytes(blob))


DAMAGE = {
    "arrays.npz truncated": lambda p: (p / "arrays.npz").write_bytes((p / "arrays.npz").read_bytes()[:1000]),
    "arrays.npz empty": lambda p: (p / "arrays.npz").write_bytes(b""),
    "arrays.npz bit-flipped": lambda p: _flip(p / "arrays.npz", 0.5),
    "arrays.npz not a zip": lambda p: (p / "arrays.npz").write_bytes(b"not a zip file at all"),
    "model.json bit-flipped": lambda p: _flip(p / "model.json", 0.5),
    "model.json one space added": lambda p: (p / "model.json").write_text(
        (p / "model.json").read_text() + " "
    ),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_any_byte_changed_in_either_file_is_refused_as_damaged_or_edited(model, case):
    DAMAGE[case](model)
    refused(model, "damaged or edited")


@pytest.mark.parametrize("case", ["arrays.npz truncated", "arrays.npz not a zip", "arrays.npz bit-flipped"])
def test_damaged_arrays_without_a_manifest_are_refused_by_name(model, case):
    (model / manifest.NAME).unlink()
    tamper(model, lambda doc, a: doc.update(version=1))
    DAMAGE[case](model)
    refused(model, "arrays.npz")


PLANTED = {
    "checkpoint_dir": {"__path__": "/somewhere"},
    "scheduler": "tcp://198.51.100.7:8786",
    "security": {"__path__": "/somewhere/key.pem"},
    "callbacks": [{"__path__": "/somewhere"}],
    "validation_data": None,
    "resume": True,
}


def test_paths_addresses_and_objects_planted_in_a_model_come_back_as_their_defaults(model, digits, tmp_path):
    planted = tmp_path / "planted"
    values = dict(PLANTED, checkpoint_dir={"__path__": str(planted)})
    tamper(model, lambda doc, a: doc["params"].update(values))
    loaded = DistributedCNN.load(model)
    params = loaded.get_params()
    assert {name: params[name] for name in PLANTED} == {name: None for name in PLANTED} | {"resume": False}
    loaded.partial_fit(*digits)
    assert not planted.exists()


def test_a_model_saved_under_the_former_tuner_names_loads_under_the_present_ones(saved, model, digits):
    # earlier versions wrote optimizer and optimizer_options into every model (None: the default),
    # before tuner= existed the tuner under optimizer, and the online tuner's run_iterations as
    # segment_iterations
    tamper(model, lambda doc, a: doc["params"].update(optimizer=None, optimizer_options=None))
    assert DistributedCNN.load(model).get_params()["tuner"] == "auto"

    def former(doc, arrays):
        for name in ("tuner", "tuner_options"):
            doc["params"].pop(name, None)
        doc["params"].update(optimizer="online", optimizer_options={"segment_iterations": 40})

    tamper(model, former)
    est = DistributedCNN.load(model)
    params = est.get_params()
    # the options of a model saved with tuner_options: the tuner object of that name with them
    assert isinstance(params["tuner"], OnlinePolicy) and params["tuner__run_iterations"] == 40
    assert "optimizer" not in params and "optimizer_options" not in params and "tuner_options" not in params
    np.testing.assert_array_equal(est.predict(digits[0]), saved[1].predict(digits[0]))
    tamper(model, lambda doc, a: doc["params"].update(tuner="online"))
    tamper(model, lambda doc, a: doc["params"].update(tuner="grid"))
    refused(model, "params.optimizer 'online'", "tuner 'grid'")


def test_a_prior_cache_path_in_former_tuner_options_is_not_restored(model):
    def former(doc, arrays):
        doc["params"].update(tuner_options={"prior_cache": "/somewhere/cache", "window": 16})
        doc["fitted"]["tuner_options_"] = {"prior_cache": "/somewhere/cache", "window": 16}

    tamper(model, former)
    loaded = DistributedCNN.load(model)
    assert loaded.tuner.get_params() == AutoPolicy(window=16).get_params() and not loaded.prior_cache


def test_a_saved_tuners_options_are_data_checked_by_its_table(model):
    def with_tuner(options):
        return lambda doc, a: doc["params"].update(tuner={"__tuner__": {"name": "auto", "params": options}})

    tamper(model, with_tuner({"window": 16}))
    assert DistributedCNN.load(model).tuner.window == 16
    tamper(model, with_tuner({"lr_grid": [0.1]}))
    refused(model, "params.tuner: 'lr_grid' is no option of the 'auto' tuner")
    tamper(model, with_tuner({"window": -3}))
    refused(model, "params.tuner: window must be None or an integer >= 2, got -3")
    tamper(model, with_tuner([["window", 16]]))
    refused(model, "params.tuner.params is a list, not a mapping")
    tamper(model, lambda doc, a: doc["params"].update(tuner={"__tuner__": {"name": "adam", "params": {}}}))
    refused(model, "params.tuner names 'adam'")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX paths")
def test_the_saved_files_name_no_path_of_the_machine_that_saved_them(saved, tmp_path, digits):
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.1, checkpoint_dir=tmp_path / "ck", **QUICK)
    est.fit(*digits)
    path = est.save(tmp_path / "m")
    assert str(tmp_path) not in (path / "model.json").read_text()
    assert DistributedCNN.load(path).checkpoint_dir is None


def test_every_attribute_a_fit_learns_is_one_the_schema_knows(saved):
    from dasknn.saving_schema import FITTED_NAMES

    learned = {k for k in vars(saved[1]) if k.endswith("_")}
    assert learned <= set(FITTED_NAMES), sorted(learned - set(FITTED_NAMES))


def test_an_early_stopped_model_and_its_checkpoint_on_request_load(tmp_path):
    from sklearn.datasets import load_digits

    from dasknn.engine import checkpoint

    d = load_digits()
    X, y = d.data.astype(np.float32) / 16, d.target
    mlp = {**QUICK, "net": "mlp", "input_shape": "flat", "learning_rate": 0.05, "batch_size": 32}
    est = DistributedCNN(**mlp, early_stopping=True, n_iter_no_change=1, max_epochs=20).fit(X, y)
    assert "restored the best" in est.stopped_by_  # its state_ is older than its last records
    loaded = DistributedCNN.load(est.save(tmp_path / "m"))
    np.testing.assert_array_equal(loaded.predict(X[:50]), est.predict(X[:50]))
    assert checkpoint.load(est.save_checkpoint(tmp_path / "ck")).state.iterations_done == est.n_iter_


def test_any_value_planted_anywhere_in_model_json_loads_or_is_a_saved_model_error(model):
    """24 seeded edits (a field set to a value of another kind, or removed), manifest recomputed:
    each loads (where the value is a valid one) or is refused by name, never another exception."""
    import random

    doc0 = json.loads((model / "model.json").read_text())
    paths: list[list] = []

    def walk(obj, at):
        items = obj.items() if isinstance(obj, dict) else enumerate(obj[:3]) if isinstance(obj, list) else ()
        for key, value in items:
            paths.append([*at, key])
            walk(value, [*at, key])

    walk(doc0, [])
    values = [None, "x", -1, 2**70, 1e308, True, [], {}, [1, 2], {"__array__": "a0"}, {"__float__": "nan"},
              {"__tuple__": [1]}, {"__items__": [[1, 2]]}, 0.5]  # fmt: skip
    rng = random.Random(0)
    outcomes = []
    for _ in range(24):
        at, value, doc = rng.choice(paths), rng.choice(values), json.loads(json.dumps(doc0))
        parent = doc
        for key in at[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and rng.random() < 0.15:
            del parent[at[-1]]
        else:
            parent[at[-1]] = value
        (model / "model.json").write_text(json.dumps(doc))
        manifest.write(model, FILES)
        try:
            DistributedCNN.load(model)
            outcomes.append("loaded")
        except SavedModelError:
            outcomes.append("refused")
    assert outcomes.count("refused") >= 8, outcomes
