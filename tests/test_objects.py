"""The objects the compiled core builds: field order, no leaks, and the dataclass contract
(equality, hashing, pickling, ``replace``, ``asdict``) for fragments made in Rust."""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import pickle
import weakref

import pytest

from pdplan import (
    BufferKind,
    BufferLayout,
    RankTransferPlan,
    TransferFragment,
    _core,
    decode_transfer_fragments,
    encode_transfer_fragments,
)

from test_api import planner


def rust_built_fragment() -> TransferFragment:
    fragments = planner(8, 2).plan_for_decode_rank(1).fragments_by_prefill_rank[5]
    return fragments[0]


@pytest.mark.parametrize(
    ("cls", "filled"),
    [
        (TransferFragment, _core.TRANSFER_FRAGMENT_FIELDS),
        (RankTransferPlan, _core.RANK_TRANSFER_PLAN_FIELDS),
        (BufferLayout, _core.BUFFER_LAYOUT_FIELDS),
    ],
)
def test_the_core_fills_fields_in_dataclass_order(cls: type, filled: list[str]) -> None:
    assert [f.name for f in dataclasses.fields(cls)] == filled


def test_the_schema_gives_the_dataclass_defaults_and_the_wire_keys() -> None:
    """The core's one fragment schema against the hand-written dataclass and real frames: the
    same defaults, and each version's frame carries exactly the fields up to that version."""
    fields = dataclasses.fields(TransferFragment)
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    assert defaults == _core.TRANSFER_FRAGMENT_DEFAULTS
    since = dict(_core.TRANSFER_FRAGMENT_SINCE)
    assert list(since) == [f.name for f in fields]
    plain = rust_built_fragment()
    for version in sorted(set(since.values())):
        # A fragment that differs from the defaults exactly in the fields of `version`.
        changed = {
            name: value + 1
            for name, value in defaults.items()
            if since[name] == version and isinstance(value, int)
        }
        if version > 1 and "rows_per_page" in changed:
            changed.update(rows_per_page=2, bytes_per_page=2 * plain.bytes_per_page)
            changed.update(src_row_stride_bytes=plain.bytes_per_page + 1)
            changed.update(dst_row_stride_bytes=plain.bytes_per_page + 1)
        # A window or a chunk needs token geometry.
        for selection in ("sliding_window", "attention_chunk_size"):
            if since[selection] == version:
                changed = {
                    name: value + 1
                    for name, value in defaults.items()
                    if since[name] == 3 and isinstance(value, int)
                }
                changed[selection] = 128
        if since["pages_unpaired"] == version:  # unpaired pages need token geometry
            changed = {
                name: value + 1
                for name, value in defaults.items()
                if since[name] == 3 and isinstance(value, int)
            }
            changed.update(pages_unpaired=1)
        if "token_runs" in changed:  # one run a token: its run strides stay 0
            changed.update(src_token_run_stride_bytes=0, dst_token_run_stride_bytes=0)
        fragment = dataclasses.replace(plain, **changed)
        frame, payload = encode_transfer_fragments([fragment])
        assert frame == str(version).encode()
        keys = list(json.loads(payload)[0])
        assert keys == [name for name, first in since.items() if first <= version]


def test_fragments_have_no_dict_so_no_stray_attribute_can_close_a_cycle() -> None:
    fragment = rust_built_fragment()
    assert not hasattr(fragment, "__dict__")
    with pytest.raises(AttributeError):
        object.__setattr__(fragment, "extra", [fragment])
    with pytest.raises(dataclasses.FrozenInstanceError):
        fragment.src_rank = 3  # type: ignore[misc]


def test_a_cycle_through_a_field_slot_is_collected() -> None:
    class Holder:
        pass

    fragment = rust_built_fragment()
    assert gc.is_tracked(fragment)
    holder = Holder()
    holder.fragment = fragment  # type: ignore[attr-defined]
    # Only object.__setattr__ gets past the frozen setter; it can still close a cycle.
    object.__setattr__(fragment, "page_count", holder)
    alive = weakref.ref(holder)
    del fragment, holder
    gc.collect()
    assert alive() is None, "a cycle through a fragment was never collected"


def test_rust_built_fragments_keep_the_dataclass_contract() -> None:
    fragment = rust_built_fragment()
    twin = TransferFragment(
        **{f.name: getattr(fragment, f.name) for f in dataclasses.fields(fragment)}
    )
    assert fragment == twin and hash(fragment) == hash(twin)
    assert pickle.loads(pickle.dumps(fragment)) == fragment
    assert copy.deepcopy(fragment) == fragment
    moved = dataclasses.replace(fragment, page_count=4)
    assert moved.page_count == 4 and moved.src_rank == fragment.src_rank
    as_dict = dataclasses.asdict(fragment)
    assert list(as_dict) == _core.TRANSFER_FRAGMENT_FIELDS
    assert as_dict["buffer_kind"] is BufferKind.TARGET_K
    decoded = decode_transfer_fragments(*encode_transfer_fragments([fragment]))
    assert decoded == (fragment,) and pickle.loads(pickle.dumps(decoded)) == decoded
