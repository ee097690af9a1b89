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
        """Write the fitted training state as a checkpoint, from which ``resume=True`` continues.

        Parameters
        ----------
        directory : str or path, optional
            The checkpoint folder; default ``checkpoint_dir``.

        Returns
        -------
        Path
            The checkpoint written (``ckpt-<iteration>`` in the folder).
        """
        self._check_fitted()
        directory = directory if directory is not None else self.checkpoint_dir
        if directory is None:
            raise ValueError("save_checkpoint needs a directory (or checkpoint_dir)")
        loop = dict(self._loop_, config=asdict(self.config_))
        tables = {"history": pd.DataFrame(self.history_), "events": self.decisions_, "trace": self.trace_}
        return save_fit(directory, self.state_, loop, tables, self._checkpoint_meta())

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write this fitted model to a new folder, without pickle.

        The folder holds the parameters and every learned attribute (model.json, arrays.npz and a
        manifest of their hashes); ``load`` reads it back. Paths, addresses and live objects
        (``callbacks``, ``security``, ``validation_data``, ``checkpoint_dir``, ``scheduler``) are
        left out, with one warning, and load as their defaults. A callback may save during a fit
        (from ``on_evaluation``): the evaluated state is written.

        Parameters
        ----------
        path : str or path
            The folder to write; it must not exist unless ``overwrite``.
        overwrite : bool, default False
            Replace a model saved there before (atomically: the old one stays whole until the new
            one is).

        Returns
        -------
        Path
            The folder written.

        Examples
        --------
        >>> folder = est.save("lenet-digits", overwrite=True)   # doctest: +SKIP
        >>> DistributedCNN.load(folder).predict(X[:3])          # doctest: +SKIP
        """
        from dasknn.saving import save

        return save(self, path, overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> SavedModel:
        """Read a model written by ``save``.

        The folder is checked against its schema and its manifest before anything is built: a
        damaged, edited or newer-format folder is refused by name (``dasknn.saving.SavedModelError``).

        Parameters
        ----------
        path : str or path
            The folder ``save`` wrote.

        Returns
        -------
        DistributedCNN
            The fitted model: it predicts without a cluster and trains on with ``partial_fit``
            (or ``warm_start=True``).
        """
        from dasknn.saving import load

        return load(path, cls)

    def to_onnx(self, path: str | os.PathLike) -> Path:
        """Write the fitted net as an ONNX graph, to serve it with any ONNX runtime.

        The graph's input ``input`` is X as ``predict_proba`` takes it (images, or rows of
        features); its outputs are ``logits`` and ``probabilities``, columns in the order of
        ``classes_`` (also in the file's metadata "classes"). Needs onnx:
        ``pip install "dasknn[export]"``.

        Parameters
        ----------
        path : str or path
            The .onnx file to write (written whole or not at all).

        Returns
        -------
        Path
            The file written.

        Raises
        ------
        dasknn.nn.export.ExportError
            The net has a layer with no faithful ONNX graph (``dasknn.nn.export.REFUSED``).
        """
        from dasknn.nn.export import export_net

        self._check_fitted()
        crop = getattr(self, "augment_", None) is not None and self.augment_.crop_size is not None
        rows = row_shape(self.input_shape, self.n_features_in_)
        return export_net(self.net_, path, rows, crop, self.classes_)

    def _checkpoint_meta(self) -> dict[str, Any]:
        gflops = self.simulated_gflops_ if self.engine == "simulated" else None
        tuner = getattr(self, "tuner_", None) or tuner_name(self.tuner)
        return checkpoint_meta(self.get_params(deep=False), tuner, self.classes_, self.n_features_in_, gflops)
