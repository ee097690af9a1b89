"""dasknn: Omnivore-style training of convolutional networks on a Dask cluster."""

from dasknn.version import __version__

__all__ = ["DistributedCNN", "__version__"]


def __getattr__(name: str):
    # `from dasknn import DistributedCNN` without importing sklearn/dask for `import dasknn.nn`
    if name == "DistributedCNN":
        from dasknn.estimator import DistributedCNN

        return DistributedCNN
    raise AttributeError(f"module 'dasknn' has no attribute {name!r}")
