"""The package version, in a module of its own so that any layer can record it without importing
the top-level package (whose lazy `DistributedCNN` would make that import a circle)."""

__version__ = "0.1.0"
