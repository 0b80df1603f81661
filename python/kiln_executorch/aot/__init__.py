"""Ahead-of-time side of Kiln: the partitioner, the KilnBackend preprocess and one-call export."""

from .export import MethodIO, export, lower, read_delegates, read_method_io, read_operators
from .backend import KilnBackend
from .partitioner import KilnPartitioner

__all__ = ["KilnBackend", "KilnPartitioner", "MethodIO", "export", "lower", "read_delegates",
           "read_method_io", "read_operators"]
