"""Folder-per-class image trees (ImageNet-style) read lazily, one dask task per chunk of images.

`root/<class>/<image>`: the class folders sorted by name give the labels 0, 1, …; `classes=8` keeps
the first 8 of them (ImageNet-8). Each image is decoded with Pillow (imported only when a chunk is
computed), converted to RGB, resized so its shorter side is `size`, and center-cropped to
`size × size`, keeping its aspect ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .chunks import samples_per_chunk

if TYPE_CHECKING:
    import dask.array as da

__all__ = ["IMAGE_EXTENSIONS", "class_names", "image_files", "imagefolder", "read_image"]

IMAGE_EXTENSIONS = frozenset({".bmp", ".gif", ".jpeg", ".jpg", ".png", ".ppm", ".tif", ".tiff", ".webp"})


def class_names(root: str | Path, classes: int | Sequence[str] | None = None) -> list[str]:
    """The sorted class folder names under `root` that `classes` selects (label i is the i-th name).

    `None` keeps all, an int n the first n sorted, a list those names (sorted; each must exist).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist")
    found = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise FileNotFoundError(f"{root} has no class folders (expected root/<class>/<image files>)")
    if classes is None:
        return found
    if isinstance(classes, (int, np.integer)) and not isinstance(classes, bool):
        if not 1 <= classes <= len(found):
            raise ValueError(f"classes={classes} but {root} has {len(found)} class folders")
        return found[: int(classes)]
    if isinstance(classes, str) or not isinstance(classes, Sequence):
        raise ValueError(f"classes must be None, an int, or a list of folder names; got {classes!r}")
    missing = sorted(set(classes) - set(found))
    if missing:
        raise ValueError(f"classes {missing} are not folders of {root}; it has {found}")
    return sorted(set(classes))


def image_files(root: str | Path, names: Sequence[str]) -> tuple[list[Path], np.ndarray]:
    """Every image file under the class folders `names` (sorted by class then file name) and its label."""
    root = Path(root)
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(names):
        found = sorted(
            p for p in (root / name).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not found:
            raise FileNotFoundError(
                f"class folder {root / name} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})"
            )
        files += found
        labels += [label] * len(found)
    return files, np.asarray(labels, dtype=np.int64)


RESIZE_MODES = ("crop", "warp")
"""How an image becomes size × size: "crop" resizes its shorter side to `size` (bilinear) and cuts
the centre, keeping the aspect ratio; "warp" resizes the whole image to size × size (bilinear), as
Caffe's ImageData layer (new_height, new_width) and `convert_imageset --resize_height
--resize_width` do, stretching images that are not square."""


def _check_resize(resize: str) -> str:
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {RESIZE_MODES}; got {resize!r}")
    return resize


def read_image(path: str | Path, size: int, resize: str = "crop") -> np.ndarray:
    """One image as (3, size, size) uint8 RGB, resized by `resize` (`RESIZE_MODES`)."""
    from PIL import Image, UnidentifiedImageError

    _check_resize(resize)
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            if resize == "warp":
                img = img.resize((size, size), Image.Resampling.BILINEAR)
            else:
                w, h = img.size
                scale = size / min(w, h)
                new_w, new_h = max(size, round(w * scale)), max(size, round(h * scale))
                img = img.resize((new_w, new_h), Image.Resampling.BILINEAR)
                left, top = (new_w - size) // 2, (new_h - size) // 2
                img = img.crop((left, top, left + size, top + size))
            pixels = np.asarray(img, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise ValueError(f"cannot decode image {path}: {err}") from err
    return pixels.transpose(2, 0, 1)


def _read_images(paths: Sequence[str], size: int, resize: str = "crop") -> np.ndarray:
    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    for i, path in enumerate(paths):
        out[i] = read_image(path, size, resize)
    return out


def imagefolder(
    root: str | Path,
    *,
    size: int = 224,
    classes: int | Sequence[str] | None = None,
    batch_size: int = 64,
    shuffle: bool = True,
    seed: int = 0,
    resize: str = "crop",
) -> tuple[da.Array, da.Array]:
    """Images (n, 3, size, size) uint8 and labels (n,) int64 of an image tree, as lazy dask arrays.

    Listing the files is eager (cheap); decoding is lazy, one `dask.delayed` task per chunk. Files
    are sorted by class, so `shuffle=True` (default) applies one fixed permutation (`seed`) to the
    file list first: chunks then mix classes, which the chunk-level shuffling of `iterate_batches`
    relies on. An undecodable file raises ValueError naming it when its chunk is computed.
    `resize`: "crop" (shorter side to `size`, centre cut) or "warp" (Caffe's: the whole image
    stretched to size × size); see `RESIZE_MODES`.
    """
    import dask  # imported on use: the dataset flags read `RESIZE_MODES` without dask arrays
    import dask.array as da

    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size must be a positive integer; got {size!r}")
    size = int(size)
    _check_resize(resize)
    files, labels = image_files(root, class_names(root, classes))
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(files))
        files, labels = [files[i] for i in order], labels[order]
    per_chunk = samples_per_chunk((3, size, size), batch_size)
    parts = []
    for start in range(0, len(files), per_chunk):
        paths = [str(p) for p in files[start : start + per_chunk]]
        block = dask.delayed(_read_images, pure=True)(paths, size, resize)
        parts.append(da.from_delayed(block, shape=(len(paths), 3, size, size), dtype=np.uint8))
    X = da.concatenate(parts, axis=0)
    y = da.from_array(labels, chunks=(X.chunks[0],))
    return X, y
