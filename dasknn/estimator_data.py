"""How DistributedCNN's training data reaches the workers: persisted or streamed, augmented, carved.

Two decisions of a fit, each a small function of the parameters it names and what it measured:
`choose_data` (persist X on the workers, or let each group's lead worker stream its batches from
X's source: `engine.dask.runs.data_mode` on X's size and the workers' memory limits) and
`resolve_augment` (the given augmentation, or a `.prototxt` net's transform_param crop/mirror).
Then `placed` puts X where the fit's runs read it, and `carved` cuts it into the three parts
(docs/architecture.md, "The three parts of the data, and their metrics").
"""

from __future__ import annotations

import math
import os
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from dasknn.data.augment import Augment, as_augment
from dasknn.data.chunks import is_dask_array, own_keys
from dasknn.data.split import Carved, Parts, carve
from dasknn.estimator_params import merged, tuner_name, tunes

if TYPE_CHECKING:
    import dask.array as da

__all__ = ["carved", "choose_data", "class_indices", "label_index", "merged", "placed", "resolve_augment"]


def resolve_augment(augment: Any, net: Any, engine: str, strategy: Any, physical_map: str) -> Augment | None:
    """The fit's augmentation: `augment`, or with None a `.prototxt` net's crop_size and mirror;
    a prototxt that crops or mirrors on a layout that cannot is a ValueError (before any cluster)."""
    augment = as_augment(augment)
    spec = os.fspath(net) if isinstance(net, os.PathLike) else net
    if augment is None and isinstance(spec, str) and spec.endswith(".prototxt"):
        from dasknn.nn.prototxt import read_augment

        found = read_augment(spec)
        augment = Augment(**found) if found else None
        if augment is not None and engine == "dask" and not merged(strategy, physical_map):
            raise ValueError(
                f"net {spec!r} crops or mirrors (transform_param), which runs on Omnivore's merged "
                f"map on the Dask engine, not with strategy={strategy!r}, "
                f"physical_map={physical_map!r}"
            )
    return augment


def choose_data(data: str, is_merged: bool, engine: Any, client: Any, X: Any) -> str:
    """'persist' or 'stream' for the fit (`data`; "auto" from X's float32 size against the
    workers' memory limits), set on the Dask engine; the simulator and the layouts other than
    Omnivore's merged map (`is_merged` False) hold X in memory ('persist')."""
    if client is None:
        return "persist"
    from dasknn.engine.dask.runs import data_mode, total_memory_limit

    requested = data if is_merged else "persist"  # the other layouts read persisted chunks
    limit = total_memory_limit(client) if requested == "auto" else None
    engine.data = data_mode(requested, int(X.shape[0]) * int(math.prod(X.shape[1:])) * 4, limit)
    return engine.data


def label_index(labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Positions of labels in the sorted `classes_` (the class index the net is trained on)."""
    return np.searchsorted(classes, labels).astype(np.int64)


def class_indices(y, classes: np.ndarray, chunks) -> tuple[da.Array, np.ndarray]:
    """y's labels as class indices: lazily, chunked as X (`chunks`), and in memory."""
    import dask.array as da

    if is_dask_array(y):
        y_idx = y.map_blocks(label_index, classes, dtype=np.int64)
        return y_idx, np.asarray(y_idx.compute())
    y_all = label_index(y, classes)
    return da.from_array(y_all, chunks=(chunks,)), y_all


def placed(mode: str, client: Any, X, y, y_all: np.ndarray, stored):
    """(X, y, the array the training part is cut from) where the fit's runs read them. Streamed:
    X as `stored` (its integer dtype, uint8 pixels, which the workers convert batch by batch) and
    the labels from memory; else, on a cluster, persisted once under this fit's own key names
    (`own_keys`): the engine's runs then reuse these chunks, and no later fit resubmits a key the
    scheduler still holds."""
    if mode == "stream":
        import dask.array as da

        train_from = stored if stored is not None and stored.chunks == X.chunks else X
        return X, da.from_array(np.asarray(y_all), chunks=(X.chunks[0],)), train_from
    if client is not None:
        fit_id = uuid.uuid4().hex
        X = client.persist(own_keys(X, fit_id)) if is_dask_array(X) else X
        y = client.persist(own_keys(y, fit_id)) if is_dask_array(y) else y
    return X, y, X


STATISTICS_SAMPLES = 512
"""Training samples a net's BatchNorm statistics are recomputed from before it is scored
(`nn.scoring.Statistics`): four batches of 128."""


def tuner_samples(params: dict[str, Any], held_out: bool = True, statistics: bool = False) -> int:
    """The training samples to carve (`optimizer.auto.MEASURED_SAMPLES`): for the "auto" tuner's
    measure when the fit's tuner is "auto" and a knob is "auto", and to check a `target_accuracy`
    judged on training batches (no `held_out` data) before the fit stops; at least
    `STATISTICS_SAMPLES` for a net with running `statistics` (BatchNorm's); else 0."""
    auto = tuner_name(params.get("tuner", "auto")) == "auto" and tunes(params)
    floor = STATISTICS_SAMPLES if statistics else 0
    if not auto and (held_out or params.get("target_accuracy") is None):
        return floor
    from dasknn.optimizer.auto import MEASURED_SAMPLES

    return max(MEASURED_SAMPLES, floor)


def statistics_samples(tuner: tuple[Any, Any] | None) -> Any:
    """The carved training samples (`Carved.tuner`) that BatchNorm's statistics are recomputed from:
    the first `STATISTICS_SAMPLES` of them (a seeded draw), None without any."""
    return None if tuner is None else tuner[0][:STATISTICS_SAMPLES]


def carved(
    X, y, parts: Parts, given, train_from, *, classes: np.ndarray, augment: Augment | None,
    batch_size: int, eval_size: int | None, seed: int, tuner_size: int = 0,
) -> Carved:  # fmt: skip
    """The fit's data in its `parts` (`dasknn.data.split.carve`): the user's validation data
    (`given`) with its labels as class indices, else the validation part; at most `eval_size` of
    it kept for scoring (seeded, drawn once; None: all); `tuner_size` of the training part for the
    "auto" tuner (seeded; 0: none); all seen through `augment`'s test view."""
    import dask

    from dasknn.data.chunks import samples_per_chunk

    if given is not None:
        given = (given[0], label_index(np.asarray(dask.compute(given[1])[0]), classes))
    n = len(parts.train)
    tuned = np.sort(np.random.default_rng(seed).choice(n, min(tuner_size, n), replace=False))
    data = carve(
        X,
        y,
        parts,
        view=(lambda X: X) if augment is None else augment.test,
        train_from=train_from,
        rows_per_chunk=samples_per_chunk(X.shape[1:], batch_size),
        given=given,
        tuner_rows=parts.train[tuned] if tuner_size else None,
    )
    n = 0 if data.validation is None else len(data.validation[1])
    if eval_size is not None and n > eval_size:
        kept = np.sort(np.random.default_rng(seed).choice(n, eval_size, replace=False))
        data.validation = (data.validation[0][kept], data.validation[1][kept])
    return data
