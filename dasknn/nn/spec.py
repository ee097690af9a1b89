"""A Net's architecture as plain JSON-able data, and the Net rebuilt from it.

What a saved model stores in place of the file or zoo function it came from (a `.prototxt` may be
gone by the time the model is loaded): each layer's type, name, hyperparameters (`Layer.config()`,
fillers as dicts) and its bottom and top blobs, plus the net's input, name, transform, seed, dtype
and loss weights. The parameters travel separately (`Net.get_params`). `net_from_spec(net_spec(n))`
computes what `n` computes (same blobs, same shapes, same outputs).
"""

from __future__ import annotations

import inspect
from dataclasses import asdict
from typing import Any

import numpy as np

from dasknn.nn.base import Layer
from dasknn.nn.fillers import Filler
from dasknn.nn.layers import LAYER_TYPES
from dasknn.nn.merge import Concat, Eltwise
from dasknn.nn.net import Net
from dasknn.nn.normalization import BatchNorm, Scale, Softmax

__all__ = ["SPEC_VERSION", "net_from_spec", "net_spec"]

SPEC_VERSION = 1
"""Version of the layout `net_spec` writes (a reader refuses a newer one)."""

CLASSES: dict[str, type[Layer]] = {
    **LAYER_TYPES,
    **{cls.type: cls for cls in (Concat, Eltwise, BatchNorm, Scale, Softmax)},
}
"""Every layer type a spec may name, by its Caffe type name."""


def _plain(value: Any) -> Any:
    """A hyperparameter as JSON: fillers as tagged dicts, tuples as lists, numpy scalars as numbers."""
    if isinstance(value, Filler):
        return {"filler": asdict(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"a net spec cannot hold a {type(value).__name__} ({value!r})")


def _layer_config(layer: Layer) -> dict[str, Any]:
    """The constructor's keyword arguments that rebuild `layer`: its `config()`, plus constructor
    arguments kept as attributes of the same name that config() leaves out (a convolution's
    `lowering` and `bp`: how it computes, not what)."""
    config = dict(layer.config())
    for name in list(inspect.signature(type(layer).__init__).parameters)[2:]:
        if name not in config and hasattr(layer, name):
            value = getattr(layer, name)
            if value is None or isinstance(value, (bool, int, float, str, tuple)):
                config[name] = value
    return {k: _plain(v) for k, v in config.items()}


def _blob_names(net: Net) -> dict[str, str]:
    """The name each blob id was written under: a blob written again in place gets the id
    `name@layer` (`Net._wire`); the input blobs keep their names."""
    names = {blob: blob for blob, _ in net.inputs}
    for layer, blob in zip(net.layers, net.tops, strict=True):
        suffix = f"@{layer.name}"
        base = blob[: -len(suffix)] if blob.endswith(suffix) else blob
        names[blob] = base if base in names.values() else blob
    return names


def net_spec(net: Net) -> dict[str, Any]:
    """`net`'s architecture as JSON-able data (no parameters), for `net_from_spec`."""
    if len(net.inputs) != 1:
        raise ValueError(f"net {net.name!r} is one phase of a split net; save the whole net")
    names = _blob_names(net)
    layers = [
        {
            "type": layer.type,
            "name": layer.name,
            "config": _layer_config(layer),
            "bottom": [names[b] for b in bottoms],
            "top": names[top],
        }
        for layer, bottoms, top in zip(net.layers, net.bottoms, net.tops, strict=True)
    ]
    blob, shape = net.inputs[0]
    return {
        "version": SPEC_VERSION,
        "name": net.name,
        "input_blob": blob,
        "input_shape": list(shape),
        "transform": net.transform,
        "seed": int(net.seed),
        "dtype": net.dtype.str,
        "loss_weights": {names[b]: w for b, w in net.loss_weights.items()},
        "layers": layers,
    }


def _argument(key: str, value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"filler"}:
        return Filler(**value["filler"])
    if isinstance(value, list):
        return tuple(_argument(key, v) for v in value)
    return value


def net_from_spec(spec: dict[str, Any]) -> Net:
    """The Net that `spec` (from `net_spec`) describes, its parameters drawn from its fillers."""
    version = spec.get("version")
    if not isinstance(version, int) or version > SPEC_VERSION:
        raise ValueError(
            f"the net was saved in spec version {version!r}; this dasknn reads versions up to "
            f"{SPEC_VERSION}: upgrade dasknn to load it"
        )
    entries = []
    for entry in spec["layers"]:
        cls = CLASSES.get(entry["type"])
        if cls is None:
            raise ValueError(f"the saved net's layer {entry['name']!r} has an unknown type {entry['type']!r}")
        kwargs = {k: _argument(k, v) for k, v in entry["config"].items()}
        bottom = entry["bottom"][0] if len(entry["bottom"]) == 1 else entry["bottom"]
        entries.append((cls(entry["name"], **kwargs), bottom, entry["top"]))
    return Net(
        entries,
        tuple(spec["input_shape"]),
        name=spec["name"],
        transform=spec["transform"],
        seed=spec["seed"],
        dtype=np.dtype(spec["dtype"]),
        loss_weights=spec["loss_weights"],
        input_blob=spec["input_blob"],
    )
