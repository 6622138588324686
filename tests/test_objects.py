"""The objects the compiled core builds: field order, no leaks, and the dataclass contract
(equality, hashing, pickling, ``replace``, ``asdict``) for fragments made in Rust."""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import pickle
import weakref

import numpy as np
import pytest

from pdplan import (
    BufferKind,
    BufferLayout,
    RankTransferPlan,
    TransferFragment,
    UnsupportedPDLayoutError,
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


def test_fragments_pdplan_makes_are_not_walked_by_the_collector() -> None:
    """A fragment holds ints, None and a BufferKind member, none of which can reach it, and its
    tuple's items never change: the cyclic collector is told to skip both (walking hundreds of
    thousands of them was most of a large plan's cost). Fragments built in Python stay tracked."""
    plan = planner(8, 2).plan_for_decode_rank(1)
    fragments = plan.fragments_by_prefill_rank[5]
    assert not gc.is_tracked(fragments) and not any(map(gc.is_tracked, fragments))
    assert not gc.is_tracked(plan.fragments_by_prefill_rank)  # a dict of untracked tuples
    decoded = decode_transfer_fragments(*encode_transfer_fragments(fragments))
    assert decoded == fragments and not any(map(gc.is_tracked, (decoded, *decoded)))
    made_in_python = dataclasses.replace(fragments[0])
    assert gc.is_tracked(made_in_python) and made_in_python == fragments[0]
    # What the collector skips is still freed by reference counting.
    alive = weakref.ref(plan)
    del plan, fragments, decoded
    assert alive() is None


def test_fragments_are_made_and_read_through_their_slots_on_this_python() -> None:
    """The slot layout is probed on a real instance at import; on every CPython the wheel
    supports it must check out, or every fragment would take the slower attribute path."""
    assert _core.fragment_slots_checked()


def test_the_benchmark_floors_do_the_work_they_stand_for() -> None:
    """The object floor makes new fragments holding the same value objects; the frame floor
    writes exactly the payload bytes encode_transfer_fragments does."""
    plan = planner(8, 2).plan_for_decode_rank(1)
    lists = list(plan.fragments_by_prefill_rank.values())
    again = _core.remake_fragments(lists[0])
    assert again == lists[0] and all(a is not b for a, b in zip(again, lists[0]))
    assert all(
        getattr(a, name) is getattr(b, name)
        for a, b in zip(again, lists[0])
        for name in _core.TRANSFER_FRAGMENT_FIELDS
    )
    assert not any(map(gc.is_tracked, again))
    written = _core.FrameFloor(lists).write()
    assert written == sum(len(encode_transfer_fragments(fs)[1]) for fs in lists)


def fields_of(fragment: object) -> dict[str, object]:
    return {name: getattr(fragment, name) for name in _core.TRANSFER_FRAGMENT_FIELDS}


def test_objects_that_are_not_exactly_transfer_fragments_take_the_attribute_path() -> None:
    fragments = planner(8, 2).plan_for_decode_rank(1).fragments_by_prefill_rank[5]
    frames = encode_transfer_fragments(fragments)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Tagged(TransferFragment):
        tag: str = "x"  # one more slot: another layout

    class Loose(TransferFragment):  # a subclass with a __dict__
        pass

    class Duck:
        def __init__(self, values: dict[str, object]) -> None:
            self.__dict__.update(values)

    for make in (lambda f: Tagged(**fields_of(f)), lambda f: Loose(**fields_of(f))):
        others = [make(f) for f in fragments]
        assert encode_transfer_fragments(others) == frames
    ducks = [Duck(fields_of(f)) for f in fragments]
    assert encode_transfer_fragments(ducks) == frames
    mixed = [ducks[0], *fragments[1:]]  # the reader's reuse of values across both paths
    assert encode_transfer_fragments(mixed) == frames


def test_a_field_slot_never_set_or_set_to_garbage_is_refused_by_name() -> None:
    fragment = rust_built_fragment()
    half = object.__new__(TransferFragment)
    for name, value in fields_of(fragment).items():
        if name != "bytes_per_page":
            object.__setattr__(half, name, value)
    with pytest.raises(UnsupportedPDLayoutError, match="bytes_per_page"):
        encode_transfer_fragments([fragment, half])
    odd = copy.copy(fragment)
    object.__setattr__(odd, "src_rank", "5")
    with pytest.raises(UnsupportedPDLayoutError, match=r"fragments\[1\].*src_rank"):
        encode_transfer_fragments([fragment, odd])


def test_equal_values_in_other_objects_read_the_same() -> None:
    """The reader reuses a value while a field holds the same object; an equal value in
    another object (a numpy integer, a big int made anew) must read the same."""
    fragments = planner(8, 2).plan_for_decode_rank(1).fragments_by_prefill_rank[5]
    frames = encode_transfer_fragments(fragments)
    renumbered = [
        dataclasses.replace(
            f,
            src_page_stride_bytes=np.uint64(f.src_page_stride_bytes),
            dst_byte_offset=int(str(f.dst_byte_offset)),
        )
        for f in fragments
    ]
    assert encode_transfer_fragments(renumbered) == frames


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
