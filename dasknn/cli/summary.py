"""`dasknn summary`: a net's layers, shapes and per-layer FLOPs and bytes."""

from __future__ import annotations

import argparse

from dasknn.cli.options import positive


def add_parser(sub, parents: list[argparse.ArgumentParser]) -> None:
    """`dasknn summary`'s options: the net (a zoo name or a .prototxt file) and its input."""
    s = sub.add_parser("summary", help="layers, shapes and costs of a net", parents=parents)
    s.add_argument("net", help="zoo name or .prototxt path")
    s.add_argument("--input-shape", type=int, nargs=3, metavar=("C", "H", "W"))
    s.add_argument("--num-classes", type=positive(int), default=10)
    s.set_defaults(func=run)


def run(args) -> int:
    """Print a net's layers, shapes and per-layer FLOPs and bytes."""
    import pandas as pd

    shape = tuple(args.input_shape) if args.input_shape else None
    if args.net.endswith(".prototxt"):
        from dasknn.nn.prototxt import read_net

        net = read_net(args.net, input_shape=shape)
    else:
        from dasknn.nn import zoo

        net = zoo.get_net(args.net, input_shape=shape, num_classes=args.num_classes)
    print(repr(net).splitlines()[0])  # the net's name, input and size: its layers are the table's rows
    table = net.summary()
    if not net.is_chain:
        table["inputs"] = [", ".join(ids) for ids in net.bottoms]
    with pd.option_context("display.width", 160, "display.max_columns", None):
        print(table)
    return 0
