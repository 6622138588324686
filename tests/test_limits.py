"""`pdplan.limits`: every bound in one place, each refusal naming the bound it met."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pdplan
from pdplan import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    UnsupportedPDLayoutError,
    limits,
    token_owners,
    token_slots,
)

ROOT = Path(__file__).resolve().parent.parent


def test_every_bound_is_a_positive_int() -> None:
    assert limits.__all__ == sorted(limits.__all__)
    for name in limits.__all__:
        value = getattr(limits, name)
        assert type(value) is int and value > 0, name


@pytest.mark.parametrize(
    ("call", "bound"),
    [
        (lambda n: token_slots([0], n, 1), "MAX_PAGE_SIZE"),
        (lambda n: token_owners(n, 1), "MAX_TOKENS"),
        (lambda n: ParallelLayout("prefill", n), "MAX_WORLD_SIZE"),
        (lambda n: ParallelLayout("prefill", 8, cp_interleave=n), "MAX_INTERLEAVE"),
        (
            lambda n: BufferLayout(0, BufferKind.TARGET_K, "kv_head", 8, 16, 1, 8, 1, n),
            "MAX_ROWS_PER_PAGE",
        ),
    ],
)
def test_the_bound_itself_is_accepted_and_one_past_it_is_refused_by_name(
    call: object, bound: str
) -> None:
    value = getattr(limits, bound)
    assert callable(call)
    try:
        call(value)
    except UnsupportedPDLayoutError as error:
        # Accepted by the bound; refused, if at all, for another reason.
        assert bound not in str(error)
    with pytest.raises(UnsupportedPDLayoutError, match=rf"pdplan\.limits\.{bound}\b"):
        call(value + 1)


def test_a_bound_has_one_message_wherever_it_is_met() -> None:
    # The same page-size bound met by three entry points reads the same.
    messages = []
    for call in (
        lambda: token_slots([0], 0, 1),
        lambda: token_owners(4, 2, cp_split="contiguous", page_size=0),
        lambda: pdplan.model_buffer_layouts(pdplan.ModelShape(2, 4, 64, page_size=0), 2, 2),
    ):
        with pytest.raises(UnsupportedPDLayoutError) as info:
            call()
        messages.append(re.sub(r"^.*?page_size", "page_size", str(info.value)))
    assert len(set(messages)) == 1, messages
    assert messages[0].endswith("(pdplan.limits.MAX_PAGE_SIZE)")


def test_slot_maps_are_bounded_before_anything_is_allocated() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="MAX_TOKENS"):
        token_slots(np.zeros(1, dtype=np.int64), 16, limits.MAX_TOKENS + 1)


def test_no_document_sends_users_to_the_private_module() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        assert "_core" not in page.read_text(encoding="utf-8"), page
