"""Errors of the loader: every one names the file, the tensor and what is wrong."""


class LoaderError(Exception):
    """A checkpoint that cannot be loaded as asked."""
