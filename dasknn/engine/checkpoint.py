"""Checkpoints of a training run: a TrainState plus JSON metadata and tables, written atomically.

A checkpoint is a folder `ckpt-<iterations_done>` of arrays.npz (every array, no pickles),
state.json (the counts, the arrays' names, the encoded `extra` and `meta`, the tables) and
manifest.json (their sizes and hashes); a save is atomic, a load checks the hashes and then the
document on its own. The layout, the encoding and the trust rule: docs/architecture.md, "Saved
models and checkpoints".
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import uuid
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasknn.engine import manifest
from dasknn.engine.trace import TrainState

__all__ = [
    "FORMAT",
    "WEIGHT_LIMIT",
    "Checkpoint",
    "CheckpointError",
    "check_document",
    "check_state",
    "decode",
    "decode_table",
    "encode",
    "encode_table",
    "healthy",
    "latest",
    "list_checkpoints",
    "load",
    "prune",
    "save",
]

FORMAT, VERSION = "dasknn-checkpoint", 2
FILES = ("state.json", "arrays.npz")
"""The files a checkpoint's manifest covers (format version 2 on; version 1 had no manifest)."""
PREFIX, TMP_PREFIX = "ckpt-", ".tmp-ckpt-"
WEIGHT_LIMIT = 1e6
"""Largest |weight| `healthy` accepts: beyond it the weights are exploding."""
MAX_COUNT = 2**53
"""Largest iteration, batch or event count a checkpoint may hold (a float64 holds it exactly)."""
MAX_SECONDS = 1e9
"""Largest clock reading (seconds, about 31 years) a checkpoint may hold."""


class CheckpointError(ValueError):
    """A checkpoint directory that is missing, incomplete, corrupted or of another format."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: the training state, the caller's metadata and tables, and where it lies."""

    state: TrainState
    meta: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    path: Path | None = None


def healthy(state: TrainState, limit: float = WEIGHT_LIMIT, statistics: Iterable[str] = ()) -> bool:
    """True when every weight and momentum buffer is finite and no |weight| exceeds `limit`. The
    blobs named in `statistics` (`Net.statistics`: BatchNorm's running sums, which reach about
    1/(1 − moving_average_fraction) times a batch's variance) need only be finite."""
    sums = set(statistics)
    for group in (state.params, state.momentum):
        for key, value in group.items():
            a = np.asarray(value)
            if not a.size or (key in sums and np.isfinite(a).all()):
                continue
            if not (np.isfinite(a).all() and float(np.abs(a).max()) <= limit):
                return False
    return True


# -- encoding --------------------------------------------------------------------------------------
def encode(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    """JSON-able form of obj; arrays and numpy scalars go to `arrays` under fresh names (also the
    format of saved models, `dasknn.saving`)."""
    if isinstance(obj, (np.ndarray, np.generic)):
        a = np.asarray(obj)
        if a.dtype.hasobject:
            raise TypeError("a checkpoint cannot hold object arrays (they would need pickle)")
        name = f"a{len(arrays)}"
        arrays[name] = a
        return {"__array__": name, "scalar": isinstance(obj, np.generic)}
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, arrays) for v in obj]}
    if isinstance(obj, list):
        return [encode(v, arrays) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode(v, arrays) for k, v in obj.items()}
        return {"__items__": [[encode(k, arrays), encode(v, arrays)] for k, v in obj.items()]}
    raise TypeError(f"a checkpoint cannot hold a {type(obj).__name__}")


def decode(obj: Any, arrays) -> Any:
    if isinstance(obj, list):
        return [decode(v, arrays) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__array__" in obj:
        a = arrays[obj["__array__"]]
        return a[()] if obj.get("scalar") else a
    if "__tuple__" in obj:
        return tuple(decode(v, arrays) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_hashable(decode(k, arrays)): decode(v, arrays) for k, v in obj["__items__"]}
    if "__float__" in obj:
        return float(obj["__float__"])
    return {k: decode(v, arrays) for k, v in obj.items()}


def _hashable(key: Any) -> Any:
    return key.item() if isinstance(key, np.generic) else key


def encode_table(df: pd.DataFrame, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Numeric and boolean columns as arrays, the others as JSON lists; attrs encoded."""
    columns = []
    for name in df.columns:
        col = df[name]
        if col.dtype.kind in "biufc":
            columns.append([str(name), encode(col.to_numpy(), arrays)])
        else:
            values = [None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in col]
            columns.append([str(name), encode([_plain(v) for v in values], arrays)])
    return {"columns": columns, "attrs": encode(dict(df.attrs), arrays)}


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def decode_table(obj: dict[str, Any], arrays) -> pd.DataFrame:
    df = pd.DataFrame({name: decode(values, arrays) for name, values in obj["columns"]})
    df.attrs.update(decode(obj["attrs"], arrays))
    return df


# -- writing ---------------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _order(path: Path) -> tuple[int, int] | None:
    """(iterations, save number) of a `ckpt-<iterations>[.<n>]` name; None for other names."""
    if not path.name.startswith(PREFIX):
        return None
    it, _, n = path.name[len(PREFIX) :].partition(".")
    if not it.isdigit() or not (n == "" or n.isdigit()):
        return None
    return int(it), int(n or 0)


def _free_name(directory: Path, iterations_done: int) -> Path:
    """`ckpt-<iterations>`, or `ckpt-<iterations>.<n>` (n = 1, 2, ...) when saved again at that iteration."""
    base = directory / f"{PREFIX}{int(iterations_done):012d}"
    taken = [o[1] for p in directory.glob(base.name + "*") if (o := _order(p)) and o[0] == iterations_done]
    return base if not taken else base.with_name(f"{base.name}.{max(taken) + 1}")


def save(
    directory: str | os.PathLike,
    state: TrainState,
    meta: dict[str, Any] | None = None,
    tables: dict[str, pd.DataFrame] | None = None,
    keep: int | None = None,
) -> Path:
    """Write `state` (+ JSON-able `meta`, DataFrame `tables`) as `ckpt-<iterations_done>/`, atomically.

    Saved again at the same iteration (e.g. on request after the last epoch's), it becomes
    `ckpt-<iterations>.<n>` (n = 1, 2, ...): nothing is ever overwritten, so every earlier
    checkpoint stays loadable throughout. `keep`: afterwards delete all but the newest `keep`
    complete checkpoints. Returns the checkpoint's path.
    """
    if not isinstance(state, TrainState):
        raise TypeError(f"state must be a TrainState, got {type(state).__name__}")
    if keep is not None and not (isinstance(keep, int) and keep >= 1):
        raise ValueError(f"keep must be None or an integer >= 1, got {keep!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "iterations_done": int(state.iterations_done),
        "batches_done": int(state.batches_done),
        "params": {k: encode(np.asarray(v), arrays)["__array__"] for k, v in state.params.items()},
        "momentum": {k: encode(np.asarray(v), arrays)["__array__"] for k, v in state.momentum.items()},
        "extra": encode(state.extra, arrays),
        "meta": encode(meta or {}, arrays),
        "tables": {name: encode_table(df, arrays) for name, df in (tables or {}).items()},
    }
    _remove_stale_temporaries(directory)
    tmp = directory / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        with open(tmp / "arrays.npz", "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        blob = (tmp / "arrays.npz").read_bytes()
        doc["arrays_bytes"] = len(blob)
        doc["arrays_sha256"] = hashlib.sha256(blob).hexdigest()
        _write(tmp / "state.json", json.dumps(doc, allow_nan=False, indent=1).encode())
        manifest.write(tmp, FILES)
        _fsync_dir(tmp)
        final = _free_name(directory, state.iterations_done)
        os.replace(tmp, final)
        _fsync_dir(directory)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.filename is None:  # a write or fsync failed (a full disk): name the checkpoint folder
            raise OSError(err.errno, err.strerror, str(directory)) from err
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        prune(directory, keep)
    return final


def _remove_stale_temporaries(directory: Path) -> None:
    """Delete `.tmp-ckpt-<pid>-*` directories left by writers that no longer run."""
    for path in directory.glob(f"{TMP_PREFIX}*"):
        pid = path.name[len(TMP_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- reading ---------------------------------------------------------------------------------------
def load(path: str | os.PathLike) -> Checkpoint:
    """Read one checkpoint directory; CheckpointError, naming the file and what is wrong, if it is
    incomplete, damaged, edited or foreign (`check_document`, `check_state`)."""
    path = Path(path)
    try:
        blobs = {name: (path / name).read_bytes() for name in FILES}
    except OSError as exc:
        raise CheckpointError(f"{path} is not a complete checkpoint: {exc}") from exc
    try:
        doc = manifest.parse_json(blobs["state.json"])
    except ValueError as exc:
        raise CheckpointError(f"{path}/state.json is unreadable ({exc}): damaged or edited") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{path}/state.json is not a {FORMAT} file")
    version = doc.get("version")
    if type(version) is not int or not 1 <= version <= VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {version!r}; this dasknn reads versions 1 to {VERSION}"
        )
    problem = manifest.check(path, FILES, blobs)
    if not problem and version >= 2 and not (path / manifest.NAME).exists():
        problem = f"{manifest.NAME} is missing: damaged or edited"
    if problem:
        raise CheckpointError(f"{path}/{problem.split()[0]} {problem.partition(' ')[2]}")
    try:
        found = _read(path, doc, blobs["arrays.npz"])
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, OSError, EOFError) as exc:
        raise CheckpointError(f"{path} is damaged or edited: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # a zip reader's own errors (BadZipFile, zlib.error) on arrays.npz
        raise CheckpointError(f"{path}/arrays.npz is damaged: {type(exc).__name__}: {exc}") from None
    return found


DOC_KEYS = {"format", "version", "iterations_done", "batches_done", "params", "momentum", "extra", "meta",
            "tables", "arrays_bytes", "arrays_sha256"}  # fmt: skip
"""The fields of state.json (versions 1 and 2)."""


def _read(path: Path, doc: dict[str, Any], blob: bytes) -> Checkpoint:
    """The checkpoint in `doc` and the bytes of its arrays.npz, checked (`check_document`)."""
    if set(doc) != DOC_KEYS:
        raise CheckpointError(
            f"{path}/state.json has unknown fields {sorted(set(doc) - DOC_KEYS)} or lacks "
            f"{sorted(DOC_KEYS - set(doc))}"
        )
    if len(blob) != doc["arrays_bytes"] or hashlib.sha256(blob).hexdigest() != doc["arrays_sha256"]:
        raise CheckpointError(f"{path}/arrays.npz does not match its checksum in state.json (corrupted)")
    with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    names = list(doc["params"].values()) + list(doc["momentum"].values())
    for part in ("extra", "meta", "tables"):
        manifest.array_names(doc[part], names)
    problem = manifest.check_array_names(names, list(arrays))
    if problem:
        raise CheckpointError(f"{path}/state.json: {problem}")
    for name in ("iterations_done", "batches_done"):
        if type(doc[name]) is not int:
            raise CheckpointError(f"{path}/state.json: {name} is {doc[name]!r}, not an integer")
    state = TrainState(
        params={k: arrays[v] for k, v in doc["params"].items()},
        momentum={k: arrays[v] for k, v in doc["momentum"].items()},
        batches_done=doc["batches_done"],
        iterations_done=doc["iterations_done"],
        extra=decode(doc["extra"], arrays),
    )
    tables = {name: decode_table(t, arrays) for name, t in doc["tables"].items()}
    meta = decode(doc["meta"], arrays)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}/state.json: meta is not a mapping")
    loop = meta.get("loop")
    finished = isinstance(loop, dict) and loop.get("finished") is True
    problem = check_state(state, loop) or check_document(path, state, tables, finished)
    if problem:
        raise CheckpointError(f"{path} is damaged: {problem}")
    return Checkpoint(state=state, meta=meta, tables=tables, path=path)


def check_document(path: Path, state: TrainState, tables: dict[str, pd.DataFrame], finished: bool) -> str:
    """What in a loaded checkpoint contradicts itself ("" when nothing): weights that are not float
    arrays, momentum buffers that are not of their weight's shape and dtype, an `iterations_done`
    that is not the one in the folder's name (`ckpt-<iterations>`), or (unless the fit had
    `finished`: its state may be an earlier, best one) below the iteration of its history's last
    row or of its kept runs' trace (rows of runs a policy undid, "auto"'s ramp, may lie beyond)."""
    for key, value in state.params.items():
        if value.dtype.kind != "f":
            return f"weight {key} has dtype {value.dtype}, not a float"
    for key, value in state.momentum.items():
        weight = state.params.get(key)
        if weight is None or weight.shape != value.shape or weight.dtype != value.dtype:
            return f"momentum {key} does not match a weight of its shape and dtype"
    order = _order(path)
    it = state.iterations_done
    if order is not None and order[0] != it:
        return f"iterations_done = {it} but the checkpoint's folder is {path.name}"
    for name in () if finished else ("history", "trace"):
        table = tables.get(name)
        if table is None or "iteration" not in table or not len(table):
            continue
        if name == "trace" and "kept" in table:
            table = table[table["kept"].astype(bool)]
        last = table["iteration"].iloc[-1:] if name == "history" else table["iteration"]
        if len(last) and float(last.max()) > it:
            return f"iterations_done = {it} is below the last iteration its {name} records"
    return ""


_CLOCKS = ("clock", "elapsed", "time_end", "time_start", "t_start", "t_conv")
_COUNTS = ("seq", "batch", "conv_version", "conv_iter", "fc_iter", "version_read", "first_iteration",
           "checkpoint_epoch", "iterations_done", "batches_done")  # fmt: skip
"""Keys of the engines' and loops' clocks (seconds) and counts, range-checked on load."""
_GENERATORS = ("rng", "fc_rng")
"""Keys of the engines' random generators' states."""


def check_state(state: TrainState, loop: dict[str, Any] | None = None) -> str:
    """What is wrong with a loaded state ("" when nothing): non-finite weights or momentum, a count
    (`_COUNTS`) outside [0, MAX_COUNT], a clock (`_CLOCKS`) not finite or outside [0, MAX_SECONDS],
    or a bit-generator state numpy refuses."""
    for kind, group in (("weight", state.params), ("momentum value", state.momentum)):
        for key, value in group.items():
            a = np.asarray(value)
            if a.dtype.kind in "fc" and not np.isfinite(a).all():
                return f"{kind} {key} is not finite (NaN or inf)"
    for name in ("iterations_done", "batches_done"):
        value = getattr(state, name)
        if not 0 <= value <= MAX_COUNT:
            return f"{name} = {value} is out of range [0, 2**53]"
    return _check_values(state.extra, "extra") or _check_values(loop or {}, "loop")


def _check_values(obj: Any, where: str) -> str:
    """The first out-of-range count, clock or bit-generator state in a decoded structure."""
    if isinstance(obj, dict):
        if "bit_generator" in obj:
            try:
                getattr(np.random, str(obj["bit_generator"]))().state = obj
            except Exception as err:
                return f"{where}: the random generator's state is out of range ({type(err).__name__}: {err})"
            return ""
        for key, value in obj.items():
            if key in _GENERATORS and not (isinstance(value, dict) and "bit_generator" in value):
                return f"{where}.{key} is not a random generator's state"
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and key in _CLOCKS and not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
                return f"{where}.{key} = {value} is out of range [0, 1e9] s"
            if number and key in _COUNTS and not 0 <= value <= MAX_COUNT:
                return f"{where}.{key} = {value} is out of range [0, 2**53]"
            found = "" if number else _check_values(value, f"{where}.{key}")
            if found:
                return found
        return ""
    if isinstance(obj, (list, tuple)):
        return next((p for v in obj if (p := _check_values(v, where))), "")
    return ""


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The `ckpt-*` directories in `directory`, oldest (fewest iterations, then first saved) first;
    not validated."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if _order(p) is not None), key=_order)


def latest(directory: str | os.PathLike) -> Checkpoint | None:
    """The newest checkpoint in `directory` that loads; None if there is none.

    Damaged ones are skipped, and when an older checkpoint is loaded because of that a one-line
    warning names both: the run goes back to the older one's iteration. When every checkpoint is
    damaged, CheckpointError names the newest (a fresh fit would silently start over)."""
    damaged: list[tuple[Path, CheckpointError]] = []
    for path in reversed(list_checkpoints(directory)):
        try:
            found = load(path)
        except CheckpointError as err:
            damaged.append((path, err))
            continue
        if damaged:
            newest, why = damaged[0]
            warnings.warn(
                f"the newest checkpoint {newest} is damaged ({' '.join(str(why).split())}); loaded the "
                f"older {path} instead: the run goes back to iteration {found.state.iterations_done}",
                stacklevel=2,
            )
        return found
    if damaged:
        newest, why = damaged[0]
        raise CheckpointError(
            f"no checkpoint in {directory} loads: the newest, {newest}, is damaged ({why}); "
            "use another --checkpoint-dir (or delete these) to start afresh"
        )
    return None


def prune(directory: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest `keep` loadable checkpoints (and broken ones older than them)."""
    kept, removed = 0, []
    for path in reversed(list_checkpoints(directory)):
        if kept < keep:
            try:
                load(path)
            except CheckpointError:
                continue
            kept += 1
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
