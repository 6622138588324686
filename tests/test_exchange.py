"""Layouts exchanged once: frames that round-trip and refuse garbage, fingerprints equal on both
sides exactly when they plan alike, the first field of a mismatch named, and
``PreparedTransfer.from_layouts`` giving the descriptors of the frames-per-request path."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_caches import sglang_mha, vllm_kv

import pdplan
from pdplan import (
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    UnsupportedPDLayoutError,
    decode_layout,
    encode_layout,
    encode_transfer_fragments,
)
from pdplan.runtimes import sglang, vllm


def sides() -> dict[str, Any]:
    """A vLLM prefill side (TP 4) and an SGLang decode side (TP 2), from their tensors."""
    p_sides = [vllm_kv(layers=3, blocks=12, block_size=16, heads=2, dim=4) for _ in range(4)]
    p = [vllm.buffers(s.tensors, backend="FLASH_ATTN", tp_size=4, num_kv_heads=8) for s in p_sides]
    pools = [sglang_mha(layers=3, size=256, page_size=64, heads=4, dim=4) for _ in range(2)]
    d = [sglang.buffers(pool, tp_size=2) for pool, _ in pools]
    return dict(
        prefill=(ParallelLayout("prefill", 4), p),
        decode=(ParallelLayout("decode", 2), d),
        keep=(p_sides, pools),
    )


def planner_of(s: dict[str, Any]) -> PDTransferPlanner:
    """The planner of both sides' own layouts and rank 0's buffers."""
    (p_layout, p), (d_layout, d) = s["prefill"], s["decode"]
    return PDTransferPlanner(
        prefill_layout=p_layout,
        decode_layout=d_layout,
        prefill_buffers=p[0].buffers,
        decode_buffers=d[0].buffers,
    )


def test_a_side_round_trips_through_its_frames() -> None:
    s = sides()
    layout, caches = s["prefill"]
    version, payload = encode_layout(
        layout, caches[1].buffers, base_ptrs=caches[1].base_ptrs, limits=caches[1].limits
    )
    assert version == pdplan.LAYOUT_VERSION_FRAME
    peer = decode_layout(version, payload)
    assert peer == (layout, caches[1].buffers, caches[1].base_ptrs, caches[1].limits)
    assert decode_layout(*encode_layout(layout, caches[1].buffers)).base_ptrs is None
    staged = ParallelLayout("decode", 8, 2, pp_size=2, pp_layer_partition=(2, 1), dcp_size=2)
    assert decode_layout(*encode_layout(staged, ())).layout == staged


def test_both_sides_build_the_same_planner_and_agree_on_its_fingerprint() -> None:
    s = sides()
    (p_layout, p), (d_layout, d) = s["prefill"], s["decode"]
    # Each side sends its layout once; each builds the planner from its own and the peer's.
    p_frames = encode_layout(p_layout, p[0].buffers)
    d_frames = encode_layout(d_layout, d[0].buffers)
    on_prefill = decode_layout(*d_frames)
    on_decode = decode_layout(*p_frames)
    at_prefill = PDTransferPlanner(
        prefill_layout=p_layout,
        decode_layout=on_prefill.layout,
        prefill_buffers=p[0].buffers,
        decode_buffers=on_prefill.buffers,
    )
    at_decode = PDTransferPlanner(
        prefill_layout=on_decode.layout,
        decode_layout=d_layout,
        prefill_buffers=on_decode.buffers,
        decode_buffers=d[0].buffers,
    )
    assert len(at_prefill.fingerprint) == 16
    assert at_prefill.fingerprint == at_decode.fingerprint
    for rank in range(2):
        assert at_prefill.transfer_fragments(rank) == at_decode.transfer_fragments(rank)
    # Anything that changes the plans changes the fingerprint.
    changed = [
        dict(decode_replicas="all"),
        dict(
            prefill_buffers=tuple(dataclasses.replace(b, layer=None) for b in p[0].buffers),
            decode_buffers=tuple(dataclasses.replace(b, layer=None) for b in d[0].buffers),
        ),
        dict(prefill_layout=ParallelLayout("prefill", 8, 2)),
    ]
    base = dict(
        prefill_layout=p_layout,
        decode_layout=d_layout,
        prefill_buffers=p[0].buffers,
        decode_buffers=d[0].buffers,
    )
    prints = {at_prefill.fingerprint}
    for change in changed:
        prints.add(PDTransferPlanner(**{**base, **change}).fingerprint)  # type: ignore[arg-type]
    assert len(prints) == 1 + len(changed)
    # Stable: another process computes the same.
    script = (
        "import sys, pdplan\n"
        "p, d = (pdplan.decode_layout(*map(bytes.fromhex, a.split(':'))) for a in sys.argv[1:])\n"
        "print(pdplan.PDTransferPlanner(prefill_layout=p.layout, decode_layout=d.layout,"
        " prefill_buffers=p.buffers, decode_buffers=d.buffers).fingerprint)\n"
    )
    args = [":".join(part.hex() for part in frames) for frames in (p_frames, d_frames)]
    out = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == at_prefill.fingerprint


def test_a_peer_whose_layout_differs_is_refused_naming_the_first_field() -> None:
    s = sides()
    (_, p), (d_layout, d) = s["prefill"], s["decode"]
    planner = planner_of(s)
    planner.check_layout(d_layout, d[1].buffers)  # another rank of the same side: the same
    other = list(d[1].buffers)
    other[5] = dataclasses.replace(other[5], bytes_per_logical_unit=64 * 2 * 8, layer=2)
    with pytest.raises(UnsupportedPDLayoutError) as caught:
        planner.check_layout(d_layout, other)
    assert "decode buffer 5 (layer 2, target_v): bytes_per_logical_unit 2048 vs 1024" in str(
        caught.value
    )
    with pytest.raises(UnsupportedPDLayoutError, match="prefill layout: world_size 4 vs 8"):
        planner.check_layout(ParallelLayout("prefill", 8), p[0].buffers)
    with pytest.raises(UnsupportedPDLayoutError, match="6 buffers vs 5"):
        planner.check_layout(d_layout, d[1].buffers[:5])


def good_payload() -> bytes:
    s = sides()
    layout, caches = s["decode"]
    return encode_layout(layout, caches[0].buffers, base_ptrs=caches[0].base_ptrs)[1]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(extra=1), "unknown field"),
        (lambda d: d.pop("cp_kv"), "missing field"),
        (lambda d: d["buffers"][0].update(page_size=-1), "invalid value"),
        (lambda d: d["buffers"][0].update(page_size=0), "page_size must be positive"),
        (lambda d: d["buffers"][0].update(buffer_kind="target_q"), "buffer_kind"),
        (lambda d: d.update(base_ptrs=[1]), "base_ptrs has 1 entries"),
        (lambda d: d.update(base_ptrs=None, limits=[1] * 6), "without base_ptrs"),
        (lambda d: d.update(world_size=3, dp_size=2), "world"),
    ],
)
def test_layout_frames_are_strict(mutate: Any, message: str) -> None:
    frame = json.loads(good_payload())
    mutate(frame)
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        decode_layout(pdplan.LAYOUT_VERSION_FRAME, json.dumps(frame).encode())


def test_layout_frames_are_bounded_before_they_are_parsed() -> None:
    payload = good_payload()
    with pytest.raises(UnsupportedPDLayoutError, match="over the limit"):
        decode_layout(pdplan.LAYOUT_VERSION_FRAME, payload, max_payload_bytes=len(payload) - 1)
    with pytest.raises(UnsupportedPDLayoutError, match="over the limit"):
        decode_layout(pdplan.LAYOUT_VERSION_FRAME, b"[" * (2 << 20))
    with pytest.raises(UnsupportedPDLayoutError, match="layout frame version"):
        decode_layout(b"1", payload)
    with pytest.raises(UnsupportedPDLayoutError, match="layout frame version"):
        decode_layout(b"", payload)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 2000))
def test_garbage_is_refused_never_raised_otherwise(noise: bytes, cut: int) -> None:
    payload = good_payload()
    for attempt in (noise, payload[:cut] + noise, payload[:cut] + payload[cut + len(noise) :]):
        try:
            decode_layout(pdplan.LAYOUT_VERSION_FRAME, attempt)
        except UnsupportedPDLayoutError:
            pass


def test_from_layouts_gives_the_descriptors_of_the_frames_path() -> None:
    s = sides()
    (_, p), (_, d) = s["prefill"], s["decode"]
    planner = planner_of(s)
    n = 90
    src = np.array([7, 3, 11, 0, 5, 9][: -(-n // 16)])
    src_slots = np.array([src[t // 16] * 16 + t % 16 for t in range(n)])
    dst_slots = np.array([[2, 3][t // 64] * 64 + t % 64 for t in range(n)])
    checked = 0
    for decode_rank in range(2):
        for prefill_rank, fragments in planner.transfer_fragments(decode_rank).items():
            addresses = dict(
                src_limits=p[prefill_rank].limits,
                dst_limits=d[decode_rank].limits,
            )
            bases = (p[prefill_rank].base_ptrs, d[decode_rank].base_ptrs)
            from_frames = PreparedTransfer.from_frames(
                *encode_transfer_fragments(fragments), *bases, **addresses
            )
            from_layouts = PreparedTransfer.from_layouts(
                planner, decode_rank, prefill_rank, *bases, **addresses
            )
            got = from_layouts.token_descriptors(src_slots, dst_slots).as_array()
            want = from_frames.token_descriptors(src_slots, dst_slots).as_array()
            np.testing.assert_array_equal(got, want)
            checked += 1
    assert checked == 4
    with pytest.raises(UnsupportedPDLayoutError, match=r"prefill rank 2 sends nothing"):
        PreparedTransfer.from_layouts(planner, 0, 2, p[2].base_ptrs, d[0].base_ptrs)
    with pytest.raises(UnsupportedPDLayoutError, match="PDTransferPlanner"):
        PreparedTransfer.from_layouts(object(), 0, 0, p[0].base_ptrs, d[0].base_ptrs)
