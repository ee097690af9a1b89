"""dasknn: Omnivore-style training of convolutional networks on a Dask cluster."""

__version__ = "0.1.0"
