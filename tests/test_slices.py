"""Slices of a request (layer groups x newly final tokens x the decode side's prefix), by slot
maps and by pages, on random models, TP sizes, page sizes, windows, chunks, MLA, state and CP.

The oracle is the whole request as the per-request path already moves it (itself held to
labelled bytes in test_tokens.py and test_end_to_end.py) with the decode side's prefix masked
out of the slot maps by hand, and, per token, the bytes of that token alone: the union of the
slices of any partition is exactly the whole request's bytes, no byte is written twice, and a
slice touches only bytes of tokens final by its end."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdplan import (
    AttentionLayer,
    BufferKind,
    CostModel,
    Mamba2Layer,
    MlaLayer,
    ModelShape,
    Pairing,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    TransferDescriptors,
    UnsupportedPDLayoutError,
    layer_groups,
    model_buffer_layouts,
    token_slots,
)
from pdplan._core import first_kept_token

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runtime_pairs import child_verdicts

#: Each buffer's memory starts at its own multiple of this, far apart.
SPAN = 1 << 32


def byte_map(d: TransferDescriptors) -> dict[int, int]:
    """Every destination byte a descriptor list writes, to the source byte it reads."""
    out: dict[int, int] = {}
    for s, t, n in zip(d.src_addrs.tolist(), d.dst_addrs.tolist(), d.lengths.tolist()):
        for k in range(n):
            assert t + k not in out, "a byte written twice in one list"
            out[t + k] = s + k
    return out


def union(lists: list[TransferDescriptors]) -> dict[int, int]:
    out: dict[int, int] = {}
    for d in lists:
        for dst, src in byte_map(d).items():
            assert dst not in out, "a byte written by two slices"
            out[dst] = src
    return out


LAYER_KINDS = {
    "full": AttentionLayer(2, 8),
    "window": AttentionLayer(2, 8, sliding_window=9),
    "chunk": AttentionLayer(2, 8, attention_chunk_size=8),
    "mla": MlaLayer(16, 8),
}


@dataclass(frozen=True)
class Case:
    kinds: tuple[str, ...]
    tps: tuple[int, int]
    sizes: tuple[int, int]
    cp: int

    def planner(self) -> PDTransferPlanner:
        layers = tuple(LAYER_KINDS[k] for k in self.kinds)

        def side(tp: int, size: int) -> Any:
            shape = ModelShape(layer_kinds=layers, dtype="bfloat16", page_size=size)
            return model_buffer_layouts(shape, tp, tp)[0]

        prefill = side(self.tps[0], self.sizes[0])
        decode = side(self.tps[1], self.sizes[1])
        cp = {"cp_size": self.cp} if self.cp > 1 else {}
        return PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", self.tps[0] * self.cp, **cp),
            decode_layout=ParallelLayout("decode", self.tps[1]),
            prefill_buffers=prefill,
            decode_buffers=decode,
            token_maps=True,
        )


def prepared_pairs(planner: PDTransferPlanner, pages: int) -> list[tuple[int, int, Any]]:
    """Every (decode rank, prefill rank, prepared transfer), each buffer's memory its own."""
    out = []
    for decode_rank in range(planner.decode_layout.world_size):
        for prefill_rank in planner.transfer_fragments(decode_rank):
            src = [SPAN * (i + 1) for i in range(len(planner.prefill_buffers))]
            dst = [SPAN * (i + 1) for i in range(len(planner.decode_buffers))]
            prepared = PreparedTransfer.from_layouts(
                planner,
                decode_rank,
                prefill_rank,
                src,
                dst,
                src_limits=[b.item_stride_bytes * pages for b in planner.prefill_buffers],
                dst_limits=[b.item_stride_bytes * pages for b in planner.decode_buffers],
            )
            out.append((decode_rank, prefill_rank, prepared))
    return out


def partition(data: st.DataObject, length: int) -> list[tuple[int, int]]:
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, length - 1)), max_size=4))))
    bounds = [0, *[c for c in cuts if 0 < c < length], length]
    return list(itertools.pairwise(bounds))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(sorted(LAYER_KINDS)), min_size=1, max_size=3),
    st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]),
    st.sampled_from([(4, 4), (4, 8), (8, 4), (3, 5)]),
    st.sampled_from([1, 2]),
    st.integers(1, 40),
    st.data(),
)
def test_slices_by_slot_maps_partition_the_whole_request(
    kinds: list[str],
    tps: tuple[int, int],
    sizes: tuple[int, int],
    cp: int,
    length: int,
    data: st.DataObject,
) -> None:
    case = Case(tuple(kinds), tps, sizes, cp)
    try:
        planner = case.planner()
    except UnsupportedPDLayoutError:
        return  # a pair the planner refuses (CP with a window it cannot deal): not a slice's
    prefix = data.draw(st.integers(0, length))
    pages = [-(-length // s) + 1 for s in sizes]
    tables = [np.array(data.draw(st.permutations(range(2 * n)))[:n], dtype=np.int64) for n in pages]
    slices = partition(data, length)
    groups = [[i] for i in range(len(kinds))] if data.draw(st.booleans()) else [None]
    known = data.draw(st.booleans())
    for decode_rank, prefill_rank, prepared in prepared_pairs(planner, 2 * max(pages)):
        layouts = (planner.prefill_layout, planner.decode_layout)
        src_slots = token_slots(tables[0], sizes[0], length, layout=layouts[0], rank=prefill_rank)
        dst_slots = token_slots(tables[1], sizes[1], length, layout=layouts[1], rank=decode_rank)
        # The whole request with the decode side's prefix masked out by hand.
        masked = dst_slots.copy()
        masked[:prefix] = -1
        whole = byte_map(prepared.token_descriptors(src_slots, masked))
        # Each token's bytes alone (windows and chunks of the final length).
        per_token = [
            set(byte_map(prepared.token_descriptors(src_slots, only(masked, t))).values())
            for t in range(length)
        ]
        moved = []
        for start, stop in slices:
            for layers in groups:
                d = prepared.token_descriptors(
                    src_slots,
                    dst_slots,
                    layers=layers,
                    tokens=range(start, stop),
                    final_length=length if known or stop == length else None,
                    decode_prefix=prefix,
                )
                if known:
                    # Only bytes of the slice's own tokens, each final by its end.
                    read = set(byte_map(d).values())
                    assert read <= set().union(*per_token[start:stop]), (start, stop)
                moved.append(d)
        got = union(moved)
        if known:
            assert got == whole
        else:
            # Unknown lengths move window and chunk tokens a longer prompt pushes out: a
            # superset of the whole request, the rest only such tokens' bytes.
            assert whole.items() <= got.items()


def only(slots: np.ndarray, token: int) -> np.ndarray:
    out = np.full_like(slots, -1)
    out[token] = slots[token]
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from([*sorted(LAYER_KINDS), "mamba"]), min_size=1, max_size=3),
    st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]),
    st.sampled_from([4, 8]),
    st.integers(1, 40),
    st.data(),
)
def test_slices_by_pages_move_each_page_once_its_last_token_is_final(
    kinds: list[str], tps: tuple[int, int], size: int, length: int, data: st.DataObject
) -> None:
    layers = tuple(
        Mamba2Layer(4, 4, 4, groups=2) if k == "mamba" else LAYER_KINDS[k] for k in kinds
    )
    shape = ModelShape(layer_kinds=layers, dtype="bfloat16", page_size=size)
    prefill, _ = model_buffer_layouts(shape, tps[0], tps[0])
    _, decode = model_buffer_layouts(shape, tps[1], tps[1])
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", tps[0]),
        decode_layout=ParallelLayout("decode", tps[1]),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    count = -(-length // size)
    src_pages = np.array(data.draw(st.permutations(range(2 * count)))[:count], dtype=np.int64)
    dst_pages = np.array(data.draw(st.permutations(range(2 * count)))[:count], dtype=np.int64)
    prefix = data.draw(st.integers(0, length // size)) * size
    slices = partition(data, length)
    state = [b.buffer_index for b in prefill if b.buffer_kind == BufferKind.MAMBA_STATE]
    for _, _, prepared in prepared_pairs(planner, 2 * count):
        want: dict[int, int] = {}
        for b in prefill:
            if b.buffer_kind == BufferKind.MAMBA_STATE:
                want |= byte_map(prepared.descriptors([1], [1], buffers=[b.buffer_index]))
                continue
            kept = first_kept_token(length, b.sliding_window, b.attention_chunk_size)
            lo = max(prefix, kept) // size
            pairs = (src_pages[lo:], dst_pages[lo:])
            want |= byte_map(prepared.descriptors(*pairs, buffers=[b.buffer_index]))
        moved = []
        all_known = True
        for start, stop in slices:
            known = stop == length or data.draw(st.booleans())
            all_known = all_known and known
            slice_ = dict(
                tokens=range(start, stop),
                final_length=length if known else None,
                decode_prefix=prefix,
            )
            by_tokens = prepared.descriptors(
                src_pages,
                dst_pages,
                buffers=[i for i in range(len(prefill)) if i not in state],
                **slice_,
            )
            # A page moves once its last token is final: never one holding a later token.
            final = min(length, stop)
            for dst in byte_map(by_tokens):
                index = (dst % SPAN) // decode[dst // SPAN - 1].item_stride_bytes
                page = list(dst_pages).index(index)
                assert min((page + 1) * size, length) <= final
            moved.append(by_tokens)
            moved.append(prepared.descriptors([1], [1], buffers=state, **slice_))
        got = union(moved)
        if all_known:
            assert got == want
        else:
            # Pages a longer prompt pushes out of a window or chunk move for nothing.
            assert want.items() <= got.items()


def test_slices_refuse_what_they_cannot_honour() -> None:
    shape = ModelShape(layer_kinds=(AttentionLayer(2, 8),), dtype="bfloat16", page_size=4)
    prefill, decode = model_buffer_layouts(shape, 1, 1)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    fragments = planner.transfer_fragments(0)[0]
    bases = [SPAN * (i + 1) for i in range(len(prefill))]
    bare = PreparedTransfer(fragments, bases, bases)
    with pytest.raises(UnsupportedPDLayoutError, match="buffer_layouts="):
        bare.descriptors([0, 1], [0, 1], layers=[0])
    with pytest.raises(UnsupportedPDLayoutError, match="buffer_layouts="):
        bare.descriptors([0, 1], [0, 1], tokens=range(0, 4))
    known = PreparedTransfer(fragments, bases, bases, buffer_layouts=prefill)
    assert known.descriptors([0, 1], [0, 1], layers=[1]).num_descriptors == 0
    assert known.descriptors([0, 1], [0, 1], layers=[0]).num_descriptors > 0
    for kwargs, refusal in [
        (dict(tokens=range(4, 2)), "backwards"),
        (dict(tokens=range(0, 8, 2)), "step 1"),
        (dict(tokens=range(0, 9)), "past the 8 tokens"),
        (dict(tokens=range(0, 6), final_length=5), "past final_length=5"),
        (dict(tokens=range(0, 8), decode_prefix=3), "whole number of 4-token pages"),
    ]:
        with pytest.raises(UnsupportedPDLayoutError, match=refusal):
            known.descriptors([0, 1], [0, 1], **kwargs)
    # Every method that takes a slice reads its keywords alike (one reader in the binding):
    # the same refusal from each, and a keyword no slice takes named as Python names one.
    request = known.request([0, 1], [0, 1])
    slots = np.arange(8, dtype=np.int64)
    takers = [
        lambda **k: known.descriptors([0, 1], [0, 1], **k),
        lambda **k: known.strided_descriptors([0, 1], [0, 1], **k),
        lambda **k: known.token_descriptors(slots, slots, **k),
        lambda **k: known.token_strided_descriptors(slots, slots, **k),
        lambda **k: request.descriptors(**k),
        lambda **k: request.strided_descriptors(**k),
    ]
    for take in takers:
        with pytest.raises(UnsupportedPDLayoutError, match="step 1"):
            take(tokens=range(0, 8, 2))
        with pytest.raises(TypeError, match="unexpected keyword argument 'layer'; a slice takes"):
            take(layer=[0])


def slices_through(engine: str) -> None:
    """Every case of slice_moves.py in one child process, each reporting its verdict."""
    code, passed, printed = child_verdicts("slice_moves.py", engine)
    assert code == 0 and len(passed) == 3, printed


def test_a_request_moved_slice_by_slice_in_any_order_equals_it_moved_whole() -> None:
    slices_through("memory")


@pytest.mark.mooncake
def test_slices_through_mooncake(mooncake_engine: None) -> None:
    slices_through("mooncake")


@pytest.mark.nixl
def test_slices_through_nixl(nixl_engine: None) -> None:
    slices_through("nixl")


def landing(groups: list[tuple[int, int]], loads: list[tuple[int, int]], model: CostModel,
            layer_s: float, per_transfer_s: float) -> float:  # fmt: skip
    """The last byte's landing, simulated step by step: prefill runs each group's layers, then
    stalls for its posting; the link takes groups in turn, each when prefill has posted it."""
    clock = link = 0.0
    for start, stop in groups:
        clock += (stop - start) * layer_s + per_transfer_s
        descriptors = sum(d for d, _ in loads[start:stop])
        nbytes = sum(b for _, b in loads[start:stop])
        wire = max(descriptors * model.per_descriptor_s, nbytes / model.network_bytes_per_s)
        link = max(clock, link) + wire
    return link


def partitions(n: int) -> Iterator[list[tuple[int, int]]]:
    """Every split of n layers into consecutive groups."""
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *[i + 1 for i, cut in enumerate(cuts) if cut], n]
        yield list(itertools.pairwise(bounds))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 4_000_000)), min_size=1, max_size=8),
    st.floats(0, 5e-3),
    st.floats(0, 1e-3),
)
def test_layer_groups_land_the_last_byte_as_early_as_any_partition(
    loads: list[tuple[int, int]], layer_s: float, per_transfer_s: float
) -> None:
    # Brute force: every partition of up to 8 layers, simulated by hand.
    model = CostModel()
    chosen = layer_groups(loads, layer_seconds=layer_s, per_transfer_s=per_transfer_s)
    groups = [(g.start, g.stop) for g in chosen.groups]
    assert [a for a, _ in groups] == [0, *[b for _, b in groups[:-1]]] and groups[-1][1] == len(
        loads
    )
    best = min(landing(p, loads, model, layer_s, per_transfer_s) for p in partitions(len(loads)))
    got = landing(groups, loads, model, layer_s, per_transfer_s)
    assert got <= best * (1 + 1e-9) + 1e-15
    compute = len(loads) * layer_s
    assert chosen.tail_s == pytest.approx(got - compute, rel=1e-9, abs=1e-12)
    whole = landing([(0, len(loads))], loads, model, layer_s, per_transfer_s) - compute
    assert chosen.whole_tail_s == pytest.approx(whole, rel=1e-9, abs=1e-12)


def test_layer_groups_refuse_what_is_no_load_or_time() -> None:
    for loads, seconds, refusal in [
        (5, 1e-3, "sequence of"),
        ("ab", 1e-3, "sequence of"),
        ([(1, 2, 3)], 1e-3, "one \\(descriptors, bytes\\) pair"),
        ([(1, -2)], 1e-3, "one \\(descriptors, bytes\\) pair"),
        ([], 1e-3, "1 to 1024 layers"),
        ([(1, 2)] * 1025, 1e-3, "1 to 1024 layers"),
        ([(1, 2)], float("nan"), "finite"),
        ([(1, 2)], "x", "must be a number"),
    ]:
        with pytest.raises(UnsupportedPDLayoutError, match=refusal):
            layer_groups(loads, layer_seconds=seconds)  # type: ignore[arg-type]
    pairing = Pairing("llama-3-8b", ParallelLayout("prefill", 2), ParallelLayout("decode", 1))
    for tokens in ("256", 0, True):
        with pytest.raises(UnsupportedPDLayoutError, match="tokens must be an int"):
            pairing.layer_groups(tokens)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(st.integers(-3, 14), st.integers(-3, 14), st.sampled_from([1, 2, 3, -1, -2, -3]))
def test_a_range_of_layers_selects_the_buffers_of_the_layers_it_names(
    start: int, stop: int, step: int
) -> None:
    # Twelve layers, full and windowed attention and Mamba2 state, at TP 2 -> 1: a layer's
    # buffers are not its index.
    window = AttentionLayer(2, 8, sliding_window=16)
    kinds = [AttentionLayer(2, 8), window, Mamba2Layer(4, 8, 4, groups=2)] * 4
    shape = ModelShape(layer_kinds=tuple(kinds), dtype="bfloat16", page_size=4)
    prefill, decode = model_buffer_layouts(shape, 2, 1)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    fragments = planner.transfer_fragments(0)[0]
    bases = [SPAN * (i + 1) for i in range(len(prefill))]
    prepared = PreparedTransfer(fragments, bases, bases, buffer_layouts=prefill)
    named = range(start, stop, step)
    if any(layer < 0 for layer in named):
        with pytest.raises(UnsupportedPDLayoutError, match="negative"):
            prepared.descriptors([0, 1], [2, 3], layers=named)
        return
    # The oracle: the buffers whose own layer the range names, by Python's membership.
    buffers = [i for i, b in enumerate(prefill) if b.layer is not None and b.layer in named]
    got = prepared.descriptors([0, 1], [2, 3], layers=named)
    want = prepared.descriptors([0, 1], [2, 3], buffers=buffers)
    assert [c.tolist() for c in got] == [c.tolist() for c in want]
    by_list = prepared.strided_descriptors([0, 1], [2, 3], layers=list(named))
    assert by_list.expand().src_addrs.tolist() == want.src_addrs.tolist()
