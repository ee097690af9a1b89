"""`dasknn export`: a saved model's net as an ONNX file (`DistributedCNN.to_onnx`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dasknn.cli.options import add_model_flag, file_to_write
from dasknn.written import check_writable


def add_parser(sub, parents: list[argparse.ArgumentParser]) -> None:
    """`dasknn export`'s options: the saved model and the ONNX file to write."""
    x = sub.add_parser(
        "export",
        parents=parents,
        help="write a saved model as an ONNX file",
        description="Write the net of a model saved by `dasknn train` (<run folder>/model) or "
        "DistributedCNN.save as an ONNX graph (outputs `logits` and `probabilities`), to serve it "
        'with onnxruntime or any ONNX runtime. Needs onnx: pip install "dasknn[export]".',
    )
    add_model_flag(x)
    x.add_argument(
        "--output",
        required=True,
        type=file_to_write("ONNX file", (".onnx",)),
        help="the ONNX file to write (FILE.onnx)",
    )
    x.set_defaults(func=run)


def run(args) -> int:
    """Write a saved model's net as an ONNX file."""
    from dasknn.estimator import DistributedCNN

    check_writable(Path(args.output).resolve().parent)
    est = DistributedCNN.load(args.model)
    path = est.to_onnx(args.output)
    print(f"wrote {path}: outputs logits and probabilities of {len(est.classes_)} classes")
    return 0
