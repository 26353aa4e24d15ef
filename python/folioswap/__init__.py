"""folioswap: numpy arrays larger than RAM, swapped in whole folios by a user-space engine.

    engine = folioswap.Engine(memory_high="256M", folio_size="2M", compressor="lz4")
    a = engine.zeros((1 << 27,), dtype=numpy.float64)   # 1 GiB, at most 256M resident
    a[:] = 1.0
    engine.stats()["zswpout"]

An array (and every view of it) keeps its region, and the region its engine, alive: the
engine's threads stop once the Engine object and every array from it are gone.
"""

import json
import math
import operator
import os

import numpy

from . import _folioswap

__all__ = ["Engine", "option_names"]
__version__ = "0.1.0"


def option_names():
    """The engine's options, as keyword arguments of Engine: memory_high, folio_size, ..."""
    return _folioswap.option_names()


def _option_text(name, value):
    """An option's value as the engine's configuration reads it (as FOLIOSWAP_* text)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    try:
        return str(operator.index(value))
    except TypeError:
        raise TypeError(
            f"option {name!r}: expected a str, an int, a float, a bool or a path, "
            f"not {type(value).__name__}"
        ) from None


def _shape(shape):
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError("negative dimensions are not allowed")
    return dims


class Engine:
    """A folioswap engine: memory from it stays under ``memory_high`` resident.

    ``memory_high`` and ``options`` are the engine's configuration keys (``folio_size``,
    ``compressor``, ``swap_file``, ``max_pool``, ...: ``option_names()``), with the values
    and error messages of the ``FOLIOSWAP_*`` environment variables, which give the
    defaults of options not passed here. Values are strings as in the environment
    (``"256M"``, ``"zstd:3"``, ``"/var/tmp:8G"``); ints, floats, bools and paths are
    taken too. ``None`` leaves an option at its default.

    A value the engine does not accept raises ValueError with the engine's message; an
    unknown option TypeError; what the system refuses (no userfaultfd, a swap file that
    cannot be made) OSError, with its errno where known.
    """

    def __init__(self, memory_high="256M", **options):
        pairs = [] if memory_high is None else [("memory_high", _option_text("memory_high", memory_high))]
        pairs += [(k, _option_text(k, v)) for k, v in options.items() if v is not None]
        self._engine = _folioswap.Engine(pairs)

    def zeros(self, shape, dtype=numpy.float64, folio_size=None):
        """A zero-filled, writable, C-contiguous numpy.ndarray in a region of this engine.

        ``folio_size`` (``"4K"`` ... ``"2M"``) overrides the engine's for this region.
        The region lives as long as the array or any view of it does. A shape with no
        elements gives a plain empty array (no region can be empty).
        """
        dtype = numpy.dtype(dtype)
        dims = _shape(shape)
        if dtype.subdtype is not None:
            # As numpy.zeros: a subarray dtype adds its dimensions to the shape.
            dtype, sub = dtype.subdtype
            dims += sub
        if dtype.hasobject:
            raise TypeError(f"folioswap arrays cannot hold Python objects (dtype {dtype})")
        nbytes = math.prod(dims) * dtype.itemsize
        folio = None if folio_size is None else _option_text("folio_size", folio_size)
        mapping = self._engine.map(nbytes, folio)
        if mapping is None:
            return numpy.zeros(dims, dtype)
        # numpy keeps `mapping` as the array's base (array interface), and views of the
        # array keep the array: the region outlives every one of them.
        return numpy.asarray(mapping).view(dtype).reshape(dims)

    def stats(self):
        """The engine's counters, memory figures and latencies: the JSON of the stats, as a dict."""
        return json.loads(self._engine.stats_json())

    @property
    def config(self):
        """The configuration the engine runs with, as a dict."""
        return json.loads(self._engine.config_json())

    def __repr__(self):
        c = self.config
        high = c.get("memory_high")
        return f"<folioswap.Engine memory_high={'max' if high is None else high}>"
