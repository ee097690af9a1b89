"""`dasknn predict`: score a dataset with a saved model, or write its predictions, in this process
(no cluster)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dasknn.cli.datasets import DATASETS, add_dataset_flags, default_dataset, load_dataset, takes
from dasknn.cli.options import add_model_flag, file_to_write
from dasknn.written import check_writable, written


def add_parser(sub, parents: list[argparse.ArgumentParser]) -> None:
    """`dasknn predict`'s options: the saved model, the dataset, where the predictions go."""
    p = sub.add_parser(
        "predict",
        parents=parents,
        help="score a dataset or write predictions with a saved model",
        description="Load a model saved by `dasknn train` (<run folder>/model) or DistributedCNN.save, "
        "and print its accuracy on a dataset, or with --output write its predictions. No cluster: "
        "the model predicts in this process.",
    )
    add_model_flag(p)
    add_dataset_flags(p)
    p.add_argument(
        "--split", choices=["train", "test"], default=None, help="the dataset's split (mnist, cifar10)"
    )
    p.add_argument(
        "--output",
        type=file_to_write("predictions file", (".csv", ".npy")),
        default=None,
        help="write the predictions instead of scoring: FILE.csv (index, prediction, one probability "
        "column per class) or FILE.npy (the predicted labels)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    """Score a dataset with a saved model, or write its predictions."""
    import numpy as np
    import pandas as pd

    from dasknn.estimator import DistributedCNN

    if args.output is not None:
        check_writable(Path(args.output).resolve().parent)
    est = DistributedCNN.load(args.model)
    args.dataset = args.dataset or default_dataset()
    args.batch_size = est.batch_size
    if args.split is not None and "split" not in DATASETS[args.dataset].options:
        applies = ", ".join(takes("split"))
        raise ValueError(f"--split does not apply to --dataset {args.dataset} (it applies to: {applies})")
    X, y = load_dataset(args, **({} if args.split is None else {"split": args.split}))
    where = f"{X.shape[0]} samples of {args.dataset}" + (f" ({args.split} split)" if args.split else "")
    if args.output is None:
        print(f"accuracy {est.score(X, y):.2%} on {where}")
        return 0
    proba = np.asarray(est.predict_proba(X).compute())
    labels = est.classes_[proba.argmax(axis=1)]
    path = Path(args.output)
    with written(path) as tmp:
        if path.suffix == ".npy":
            np.save(tmp, labels, allow_pickle=False)
        else:
            table = pd.DataFrame({"index": np.arange(len(labels)), "prediction": labels})
            for i, label in enumerate(est.classes_):
                table[f"p_{label}"] = proba[:, i]
            table.to_csv(tmp, index=False)
    print(f"wrote {len(labels)} predictions for {where} to {path}")
    return 0
