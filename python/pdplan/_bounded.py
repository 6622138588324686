"""A caller's iterable read to a bound: an endless iterator is refused, never read without
end (the core reads its own arguments the same way, src/python/convert.rs)."""

from __future__ import annotations

import itertools
import reprlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from pdplan import _core
from pdplan._core import UnsupportedPDLayoutError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

T = TypeVar("T")

#: A caller's or peer's value in a message: strings cut to 64 characters, lists to 16 entries,
#: nesting to 2 levels (the core cuts its quotes the same way, ``error::quoted``).
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 66
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = _SHOWN.maxfrozenset = 16
_SHOWN.maxlevel = 2

#: Ints up to this many bits are shown whole (2^64 and 10^100 as written); longer ones by size.
_SHOWN_INT_BITS = 512


def shown(value: object) -> str:
    """``repr(value)`` for a message, bounded whatever the value: an int as given (by its size
    past 512 bits), text and containers cut, saying they were."""
    if isinstance(value, int) and not isinstance(value, bool):
        bits = value.bit_length()
        return repr(value) if bits <= _SHOWN_INT_BITS else f"<an int of {bits} bits>"
    if isinstance(value, (str, bytes)) and len(value) > _SHOWN.maxstring - 2:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{_SHOWN.repr(value)} ({len(value)} {unit})"
    try:
        return _SHOWN.repr(value)
    except ValueError:  # an int inside too long for str() (CPython's digit limit)
        return f"<a {type(value).__name__}>"


def bounded_tuple(items: Iterable[T], what: str, bound: str) -> tuple[T, ...]:
    """``items`` as a tuple, refused when they are more than ``pdplan.limits.<bound>``."""
    most: int = getattr(_core, bound)
    try:
        taken = tuple(itertools.islice(items, most + 1))
    except TypeError:
        raise UnsupportedPDLayoutError(
            f"{what} must be an iterable, got {type(items).__name__}"
        ) from None
    if len(taken) > most:
        raise UnsupportedPDLayoutError(
            f"len({what}) is above the limit of {most} (pdplan.limits.{bound}); an iterable is "
            "read up to the bound and refused past it"
        )
    return taken


def int_ids(values: Any, what: str) -> npt.NDArray[np.int64]:
    """A caller's 1-D integers (block ids, slots) as int64, refused naming ``what`` when they
    are not whole numbers of 64 bits in one dimension."""
    import numpy as np

    try:
        array = np.asarray(values)
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise TypeError(array.dtype)
        ids = array.astype(np.int64, casting="safe" if array.dtype.kind == "i" else "unsafe")
    except (TypeError, ValueError, OverflowError):
        raise UnsupportedPDLayoutError(
            f"{what} must be integers (a 1-D array or a sequence of ints)"
        ) from None
    if ids.ndim != 1:
        raise UnsupportedPDLayoutError(f"{what} must be 1-D, got {ids.ndim}-D")
    if array.dtype.kind == "u" and array.size and int(array.max()) >= 1 << 63:
        raise UnsupportedPDLayoutError(f"{what} holds a value past 2^63")
    return ids
