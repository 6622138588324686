"""The wire format: v1 reference-identical, v2 for row fragments, strict decoding of both,
fuzzed frames."""

from __future__ import annotations

import json
import resource
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdplan import (
    DEFAULT_MAX_FRAGMENTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    TRANSFER_PLAN_READABLE_VERSIONS,
    BufferKind,
    TransferFragment,
    UnsupportedPDLayoutError,
    decode_transfer_fragments,
    encode_transfer_fragments,
)

BELOW_2_63 = st.integers(0, 2**63 - 1)

fragments = st.builds(
    TransferFragment,
    buffer_index=BELOW_2_63,
    buffer_kind=st.sampled_from(list(BufferKind)),
    src_rank=BELOW_2_63,
    dst_rank=BELOW_2_63,
    src_page_stride_bytes=BELOW_2_63,
    dst_page_stride_bytes=BELOW_2_63,
    src_byte_offset=BELOW_2_63,
    dst_byte_offset=BELOW_2_63,
    bytes_per_page=BELOW_2_63,
    page_count=st.none() | BELOW_2_63,
)


@st.composite
def row_fragments(draw: Any) -> TransferFragment:
    """A valid row fragment: `rows` runs a page, strides at least a run long."""
    rows = draw(st.integers(2, 64))
    run = draw(st.integers(1, 2**20))
    src_stride = draw(st.integers(run, 2**40))
    dst_stride = draw(st.integers(run, 2**40))
    base = draw(fragments)
    return TransferFragment(
        *[getattr(base, name) for name in V1_KEYS[:8]],
        bytes_per_page=rows * run,
        page_count=base.page_count,
        rows_per_page=rows,
        src_row_stride_bytes=src_stride,
        dst_row_stride_bytes=dst_stride,
    )


#: The reference's keys, in its order: what a v1 frame carries.
V1_KEYS = (
    "buffer_index",
    "buffer_kind",
    "src_rank",
    "dst_rank",
    "src_page_stride_bytes",
    "dst_page_stride_bytes",
    "src_byte_offset",
    "dst_byte_offset",
    "bytes_per_page",
    "page_count",
)
ROW_KEYS = ("rows_per_page", "src_row_stride_bytes", "dst_row_stride_bytes")


def reference_payload(
    items: tuple[TransferFragment, ...], keys: tuple[str, ...] = V1_KEYS
) -> bytes:
    """What the reference encoder writes: compact JSON, keys in field order (v2: the v1 keys,
    then the row keys)."""
    return json.dumps(
        [
            {
                key: (f.buffer_kind.value if key == "buffer_kind" else getattr(f, key))
                for key in keys
            }
            for f in items
        ],
        separators=(",", ":"),
    ).encode("utf-8")


GOOD = TransferFragment(3, BufferKind.TARGET_V, 1, 0, 4096, 16384, 0, 4096, 4096)


def good_entry() -> dict[str, Any]:
    return dict(json.loads(encode_transfer_fragments((GOOD,))[1])[0])


def decode_entries(entries: Any) -> tuple[TransferFragment, ...]:
    return decode_transfer_fragments(b"1", json.dumps(entries).encode())


@settings(max_examples=200)
@given(st.lists(fragments, max_size=8).map(tuple))
def test_encoding_matches_the_reference_and_round_trips(items: tuple[Any, ...]) -> None:
    version, payload = encode_transfer_fragments(items)
    assert version == b"1"
    assert payload == reference_payload(items)
    assert decode_transfer_fragments(version, payload) == items


def test_empty_frames_decode_to_nothing() -> None:
    assert decode_transfer_fragments(None, None) == ()
    assert decode_transfer_fragments(b"", b"") == ()
    assert decode_transfer_fragments(b"1", b"[]") == ()
    assert encode_transfer_fragments(()) == (b"1", b"[]")


def test_decoding_accepts_any_valid_json_spelling() -> None:
    spaced = json.dumps([good_entry()], indent=2).encode()
    assert decode_transfer_fragments(b"1", spaced) == (GOOD,)
    escaped = spaced.replace(b"target_v", b"target\\u005fv")
    assert decode_transfer_fragments(b"1", escaped) == (GOOD,)


def test_invalid_utf8() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="UTF-8"):
        decode_transfer_fragments(b"1", b'[{"buffer_kind":"\xff"}]')


@pytest.mark.parametrize("payload", [b"[", b"not json", b"[{}]]", b"[1,]", b"[NaN]"])
def test_invalid_json(payload: bytes) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="invalid transfer plan payload"):
        decode_transfer_fragments(b"1", payload)


@pytest.mark.parametrize("payload", [b"{}", b"1", b'"x"', b"null", b"true"])
def test_top_level_not_a_list(payload: bytes) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=r"sequence|expected"):
        decode_transfer_fragments(b"1", payload)


@pytest.mark.parametrize("entry", [1, "x", None, [], True])
def test_entry_not_an_object(entry: Any) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="transfer fragment object"):
        decode_entries([entry])


@pytest.mark.parametrize("key", list(good_entry()))
def test_missing_key(key: str) -> None:
    entry = good_entry()
    del entry[key]
    with pytest.raises(UnsupportedPDLayoutError, match=f"missing field `{key}`"):
        decode_entries([entry])


def test_unknown_key() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="unknown field `extra`"):
        decode_entries([{**good_entry(), "extra": 0}])


def test_duplicate_key() -> None:
    payload = encode_transfer_fragments((GOOD,))[1].replace(
        b'"src_rank":1', b'"src_rank":1,"src_rank":2'
    )
    with pytest.raises(UnsupportedPDLayoutError, match="duplicate field"):
        decode_transfer_fragments(b"1", payload)


@pytest.mark.parametrize("kind", ["target_q", "TARGET_K", "", 1, None])
def test_buffer_kind_outside_the_enum(kind: Any) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=r"buffer_kind|string"):
        decode_entries([{**good_entry(), "buffer_kind": kind}])


INTEGER_FIELDS = [k for k in good_entry() if k != "buffer_kind"]


@pytest.mark.parametrize("field", INTEGER_FIELDS)
@pytest.mark.parametrize("value", [1.0, 1.5, "1", True, False, [1], {"a": 1}])
def test_integer_field_of_the_wrong_json_type(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="integer"):
        decode_entries([{**good_entry(), field: value}])


@pytest.mark.parametrize("field", [f for f in INTEGER_FIELDS if f != "page_count"])
def test_null_only_for_page_count(field: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="integer"):
        decode_entries([{**good_entry(), field: None}])
    assert decode_entries([{**good_entry(), "page_count": None}])[0].page_count is None


@pytest.mark.parametrize("field", INTEGER_FIELDS)
@pytest.mark.parametrize("value", [-1, 2**63, 2**64, 10**30])
def test_integer_out_of_range(field: str, value: int) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="integer"):
        decode_entries([{**good_entry(), field: value}])


def test_largest_integer_is_accepted() -> None:
    decoded = decode_entries([{**good_entry(), "bytes_per_page": 2**63 - 1}])
    assert decoded[0].bytes_per_page == 2**63 - 1


@pytest.mark.parametrize(
    "version", [b"7", b"0", b"01", b" 1", b"1\n", b"+1", b"\xff", b"v1", b"2 "]
)
def test_unknown_versions(version: bytes) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="version"):
        decode_transfer_fragments(version, b"[]")


@pytest.mark.parametrize(
    ("version", "payload"), [(b"1", None), (b"1", b""), (None, b"[]"), (b"", b"[]")]
)
def test_one_frame_without_the_other(version: bytes | None, payload: bytes | None) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="incomplete"):
        decode_transfer_fragments(version, payload)


def test_frames_must_be_bytes() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="bytes"):
        decode_transfer_fragments("1", "[]")  # type: ignore[arg-type]


def test_deeply_nested_payload_is_refused_not_a_crash() -> None:
    with pytest.raises(UnsupportedPDLayoutError):
        decode_transfer_fragments(b"1", b"[" * 200_000)


#: Bytes a mutation inserts: JSON that breaks types, structure or UTF-8, and row keys.
TOKENS = [b"-", b"1", b".5", b"e9", b"null", b"true", b'"', b",", b"{", b"]", b"\xc3", b"0"]
TOKENS += [b',"rows_per_page":2', b',"src_row_stride_bytes":0']


@st.composite
def mutated_frames(draw: Any) -> tuple[bytes, bytes]:
    items = draw(st.lists(fragments | row_fragments(), min_size=1, max_size=3).map(tuple))
    version, payload = encode_transfer_fragments(items)
    data = bytearray(payload)
    for _ in range(draw(st.integers(1, 6))):
        action = draw(st.sampled_from(["flip", "insert", "delete", "splice"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if action == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif action == "insert":
            token = draw(st.sampled_from(TOKENS))
            data[at:at] = token
        elif action == "delete" and data:
            del data[at : at + draw(st.integers(1, 8))]
        else:
            data[at:at] = draw(st.binary(max_size=8))
    if draw(st.integers(0, 9)) == 0:
        version = draw(st.binary(max_size=3) | st.sampled_from([b"1", b"2"]))
    return version, bytes(data)


@settings(max_examples=1000)
@given(mutated_frames())
def test_fuzzed_frames_give_valid_fragments_or_a_clear_error(frames: tuple[bytes, bytes]) -> None:
    try:
        decoded = decode_transfer_fragments(*frames)
    except UnsupportedPDLayoutError:
        return
    for fragment in decoded:
        assert isinstance(fragment, TransferFragment)
        assert isinstance(fragment.buffer_kind, BufferKind)
        for name, value in asdict(fragment).items():
            optional = name in ("page_count", "sliding_window", "attention_chunk_size")
            if name == "buffer_kind" or (optional and value is None):
                continue
            assert type(value) is int and 0 <= value < 2**63
    # What decodes re-encodes to an equivalent list.
    assert decode_transfer_fragments(*encode_transfer_fragments(decoded)) == decoded


def test_encoding_refuses_what_is_not_a_fragment() -> None:
    from types import SimpleNamespace

    with pytest.raises(UnsupportedPDLayoutError, match="fragments must be a sequence"):
        encode_transfer_fragments(5)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedPDLayoutError, match=r"fragments\[0\]: expected an object"):
        encode_transfer_fragments([object()])  # type: ignore[list-item]
    duck = SimpleNamespace(**{**asdict(GOOD), "buffer_kind": "target_v"})
    assert encode_transfer_fragments([duck]) == encode_transfer_fragments([GOOD])  # type: ignore[list-item]
    negative = SimpleNamespace(**{**asdict(GOOD), "src_rank": -1})
    with pytest.raises(UnsupportedPDLayoutError, match=r"fragments\[0\]: src_rank must be"):
        encode_transfer_fragments([negative])  # type: ignore[list-item]
    unknown = SimpleNamespace(**{**asdict(GOOD), "buffer_kind": "target_q"})
    with pytest.raises(UnsupportedPDLayoutError, match="buffer_kind"):
        encode_transfer_fragments([unknown])  # type: ignore[list-item]


def test_the_default_frame_limits_are_16_mib_and_65536_fragments() -> None:
    assert DEFAULT_MAX_PAYLOAD_BYTES == 16 * 2**20
    assert DEFAULT_MAX_FRAGMENTS == 65_536


def test_a_huge_frame_is_refused_on_its_length_without_copying_it() -> None:
    huge = b"[" + b" " * (64 * 2**20) + b"]"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(UnsupportedPDLayoutError, match="over the limit of 16777216 bytes"):
        decode_transfer_fragments(b"1", huge)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 8 * 1024, f"refusing the frame grew the process by {grown_kib} KiB"
    # The caller may raise the limit for a plan that really is this large.
    assert decode_transfer_fragments(b"1", huge, max_payload_bytes=len(huge)) == ()


def test_too_many_fragments_are_refused_while_parsing() -> None:
    version, payload = encode_transfer_fragments([GOOD] * 5)
    assert len(decode_transfer_fragments(version, payload, max_fragments=5)) == 5
    with pytest.raises(UnsupportedPDLayoutError, match="more than 4 fragments"):
        decode_transfer_fragments(version, payload, max_fragments=4)
    # Under the byte limit but past the default count: short fragments, many of them.
    small = TransferFragment(0, BufferKind.TARGET_K, 0, 0, 1, 1, 0, 0, 1)
    version, payload = encode_transfer_fragments([small] * (DEFAULT_MAX_FRAGMENTS + 1))
    assert len(payload) < DEFAULT_MAX_PAYLOAD_BYTES
    with pytest.raises(UnsupportedPDLayoutError, match="more than 65536 fragments"):
        decode_transfer_fragments(version, payload)


@pytest.mark.parametrize("bad", [-1, 1.5, "16", True])
def test_frame_limits_must_be_whole_numbers(bad: Any) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="max_fragments must be an integer"):
        decode_transfer_fragments(b"1", b"[]", max_fragments=bad)


@settings(max_examples=200)
@given(st.lists(fragments, max_size=4), st.lists(row_fragments(), min_size=1, max_size=4))
def test_a_list_with_row_fragments_is_version_2(plain: list[Any], rows: list[Any]) -> None:
    items = tuple(plain + rows)
    version, payload = encode_transfer_fragments(items)
    assert version == b"2"
    assert payload == reference_payload(items, V1_KEYS + ROW_KEYS)
    assert decode_transfer_fragments(version, payload) == items


def test_v1_frames_carry_no_row_keys_and_v2_frames_carry_all() -> None:
    row = TransferFragment(
        0, BufferKind.TARGET_K, 0, 0, 8192, 32768, 0, 256, 4096, None, 16, 256, 1024
    )
    _, payload = encode_transfer_fragments([row])
    entry = json.loads(payload)[0]
    with pytest.raises(
        UnsupportedPDLayoutError, match="version 1 frame carries `rows_per_page`, a field of"
    ):
        decode_transfer_fragments(b"1", payload)
    for key in ROW_KEYS:
        partial = {k: v for k, v in entry.items() if k != key}
        with pytest.raises(UnsupportedPDLayoutError, match=f"missing field `{key}`"):
            decode_transfer_fragments(b"2", json.dumps([partial]).encode())
        with pytest.raises(UnsupportedPDLayoutError, match="integer"):
            decode_transfer_fragments(b"2", json.dumps([{**entry, key: -1}]).encode())
    # v1 rules hold field by field in v2 too.
    with pytest.raises(UnsupportedPDLayoutError, match="integer"):
        decode_transfer_fragments(b"2", json.dumps([{**entry, "src_rank": 1.5}]).encode())
    # A row stride shorter than a run would overlap the rows of a page.
    with pytest.raises(UnsupportedPDLayoutError, match="at least the 256-byte run"):
        decode_transfer_fragments(
            b"2", json.dumps([{**entry, "dst_row_stride_bytes": 255}]).encode()
        )
    with pytest.raises(UnsupportedPDLayoutError, match="whole number of rows_per_page"):
        decode_transfer_fragments(b"2", json.dumps([{**entry, "rows_per_page": 3}]).encode())
    # A plain fragment in a v2 frame is allowed; it decodes to the same fragment.
    plain = {
        **good_entry(),
        "rows_per_page": 1,
        "src_row_stride_bytes": 0,
        "dst_row_stride_bytes": 0,
    }
    assert decode_transfer_fragments(b"2", json.dumps([plain]).encode()) == (GOOD,)
    assert TRANSFER_PLAN_READABLE_VERSIONS == (1, 2, 3, 4, 5, 6)
