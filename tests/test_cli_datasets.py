"""`dasknn train` sets a dataset's options (imagefolder's image size, classes and resize) and words
the loaders' errors in its own flags (--data-dir, not path=)."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from dasknn.cli import main
from tests.test_bad_input import cli  # the in-process run: exit status and stderr


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Three class folders of twelve 40×30 PNGs each (a bright square whose place is the class)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for label, name in enumerate(("circle", "square", "star")):
        (root / name).mkdir()
        for k in range(12):
            pixels = rng.integers(0, 60, (30, 40, 3), dtype=np.uint8)
            pixels[5:15, 5 + 10 * label : 15 + 10 * label] = 250
            Image.fromarray(pixels).save(root / name / f"{k}.png")
    return root


def test_train_on_an_image_folder_at_the_size_and_classes_given(tree, tmp_path):
    run, out = tmp_path / "run", io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):  # the header is a log line
        code = main([
        "train", "--dataset", "imagefolder", "--data-dir", str(tree), "--image-size", "28",
        "--classes", "2", "--resize", "warp", "--engine", "simulated", "--max-epochs", "1",
        "--n-groups", "1", "--n-workers", "1", "--lr", "0.01", "--momentum", "0.9", "--batch-size", "4",
        "--validation-fraction", "0", "--eval-size", "24", "--output", str(run),
    ])  # fmt: skip
    assert code in (0, 1), out.getvalue()  # target reached or budget out: both trained
    assert "lenet on imagefolder (24, 3, 28, 28)" in out.getvalue()  # 2 classes of 12 images, 28×28
    history = pd.read_csv(run / "history.csv")
    assert history["epoch"].iloc[-1] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--dataset", "imagefolder"], "--dataset imagefolder needs --data-dir"),
        (["--dataset", "imagefolder", "--data-dir", "{tree}", "--classes", "5"], "--classes 5 but"),
        (
            ["--dataset", "imagefolder", "--data-dir", "{tree}", "--classes", "cat,star"],
            "--classes ['cat'] are not folders",
        ),
        (["--dataset", "mnist", "--image-size", "32"], "--image-size does not apply to --dataset mnist"),
        (["--dataset", "digits", "--resize", "warp"], "--resize does not apply to --dataset digits"),
        (
            ["--dataset", "imagefolder", "--data-dir", "{tree}", "--image-size", "0"],
            "argument --image-size: must be",
        ),
    ],
)
def test_dataset_errors_name_the_flags(argv, expected, tree):
    code, err = cli("train", *[a.format(tree=tree) for a in argv], "--engine", "simulated", "-q")
    assert code == 2 and expected in err, err
    assert "path=" not in err and "size=" not in err and "classes=" not in err
