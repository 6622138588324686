"""A caller's iterable read to a bound: an endless iterator is refused, never read without
end (the core reads its own arguments the same way, src/python/convert.rs)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TypeVar

from pdplan import _core
from pdplan._core import UnsupportedPDLayoutError

T = TypeVar("T")


def bounded_tuple(items: Iterable[T], what: str, bound: str) -> tuple[T, ...]:
    """``items`` as a tuple, refused when they are more than ``pdplan.limits.<bound>``."""
    most: int = getattr(_core, bound)
    taken = tuple(itertools.islice(items, most + 1))
    if len(taken) > most:
        raise UnsupportedPDLayoutError(
            f"len({what}) is above the limit of {most} (pdplan.limits.{bound}); an iterable is "
            "read up to the bound and refused past it"
        )
    return taken
