"""What a fitted DistributedCNN writes and reads: checkpoints on request, the saved-model folder
(`dasknn.saving`), and the ONNX file (`dasknn.nn.export`). A base class of the estimator, so that
these methods sit beside the fit they persist without growing it."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from dasknn.estimator_input import row_shape
from dasknn.estimator_params import tuner_name
from dasknn.estimator_resume import checkpoint_meta, save_fit

__all__ = ["SavedModel"]


class SavedModel:
    """Checkpoints, `save`/`load` and ONNX export of a fitted estimator (`DistributedCNN`)."""

    def save_checkpoint(self, directory: str | os.PathLike | None = None) -> Path:
        """Write the fitted state as a checkpoint (on request) to `directory` or `checkpoint_dir`."""
        self._check_fitted()
        directory = directory if directory is not None else self.checkpoint_dir
        if directory is None:
            raise ValueError("save_checkpoint needs a directory (or checkpoint_dir)")
        loop = dict(self._loop_, config=asdict(self.config_))
        tables = {"history": pd.DataFrame(self.history_), "events": self.decisions_, "trace": self.trace_}
        return save_fit(directory, self.state_, loop, tables, self._checkpoint_meta())

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write this fitted model to the folder `path`, without pickle (`dasknn.saving`); also from
        a callback's `on_evaluation` during a fit (the evaluated state)."""
        from dasknn.saving import save

        return save(self, path, overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> SavedModel:
        """A model written by `save`: it predicts without a cluster and trains on (`partial_fit`)."""
        from dasknn.saving import load

        return load(path, cls)

    def to_onnx(self, path: str | os.PathLike) -> Path:
        """Write the fitted net to the ONNX file `path` (`dasknn.nn.export`): its input is X as
        predict_proba takes it, its outputs `logits` and `probabilities` (columns: `classes_`).
        Needs onnx: `pip install "dasknn[export]"`."""
        from dasknn.nn.export import export_net

        self._check_fitted()
        crop = getattr(self, "augment_", None) is not None and self.augment_.crop_size is not None
        rows = row_shape(self.input_shape, self.n_features_in_)
        return export_net(self.net_, path, rows, crop, self.classes_)

    def _checkpoint_meta(self) -> dict[str, Any]:
        gflops = self.simulated_gflops_ if self.engine == "simulated" else None
        tuner = getattr(self, "tuner_", None) or tuner_name(self.tuner)
        return checkpoint_meta(self.get_params(deep=False), tuner, self.classes_, self.n_features_in_, gflops)
