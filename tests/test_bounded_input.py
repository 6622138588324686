"""Bad input is bounded: two buffers of one index are refused wherever buffers enter, every
iterable argument is read to its bound and refused past it (an endless iterator is an error,
never a hang), text echoed from a caller or a peer is cut, and numbers are reported as given."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from pdplan import (
    CacheBuffers,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    UnsupportedPDLayoutError,
    buffer_from_array,
    decode_layout,
    encode_layout,
    encode_transfer_fragments,
    limits,
    model_buffer_layouts,
    transfer_descriptors,
)

# A message quotes at most this much of what it was given (the core cuts at 64 characters).
SHORT = 400


def llama(prefill_tp: int = 2, decode_tp: int = 1) -> tuple[list, list]:
    prefill, decode = model_buffer_layouts(ModelShape.preset("llama-3-8b"), prefill_tp, decode_tp)
    return list(prefill), list(decode)


def llama_planner() -> PDTransferPlanner:
    """Llama-3-8B at prefill TP 2 -> decode TP 1."""
    prefill, decode = llama()
    return PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )


def with_index_of_its_neighbour(buffers: list) -> list:
    """V of layer 0 given K's index: K and V would land on the same bytes."""
    return [buffers[0], dataclasses.replace(buffers[1], buffer_index=buffers[0].buffer_index)]


def test_two_buffers_of_one_index_are_refused_by_the_planner() -> None:
    prefill, decode = llama()
    with pytest.raises(UnsupportedPDLayoutError, match=r"buffers 0 and 1 both have buffer_index 0"):
        PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 2),
            decode_layout=ParallelLayout("decode", 1),
            prefill_buffers=with_index_of_its_neighbour(prefill),
            decode_buffers=with_index_of_its_neighbour(decode),
        )


def test_two_buffers_of_one_index_are_refused_in_layout_frames() -> None:
    prefill, _ = llama()
    twice = with_index_of_its_neighbour(prefill)
    with pytest.raises(UnsupportedPDLayoutError, match="both have buffer_index 0"):
        encode_layout(ParallelLayout("prefill", 2), twice)
    # A peer's frame naming one index twice, written by hand as a peer would send it.
    version, payload = encode_layout(ParallelLayout("prefill", 2), prefill[:2])
    peer = json.loads(payload)
    peer["buffers"][1]["buffer_index"] = peer["buffers"][0]["buffer_index"]
    with pytest.raises(UnsupportedPDLayoutError, match="both have buffer_index 0"):
        decode_layout(version, json.dumps(peer).encode())


def endless(value: object) -> Iterator[object]:
    return itertools.repeat(value)


CACHE = np.zeros((4, 16, 8, 64), dtype=np.uint16)
AXES = ("page", "token", "head", "dim")

ENDLESS: dict[str, tuple[Callable[[], object], str]] = {
    "axes": (lambda: buffer_from_array(0, "target_k", CACHE, endless("dim")), "MAX_ARRAY_AXES"),
    "logical_parts": (
        lambda: buffer_from_array(0, "target_k", CACHE, AXES, logical_parts=endless(8)),
        "MAX_PARTS",
    ),
    "pp_layer_partition": (
        lambda: ParallelLayout("prefill", 2, pp_size=2, pp_layer_partition=endless(1)),  # type: ignore[arg-type]
        "MAX_STAGES",
    ),
    "prefill_buffers": (
        lambda: PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 2),
            decode_layout=ParallelLayout("decode", 1),
            prefill_buffers=endless(llama()[0][0]),  # type: ignore[arg-type]
            decode_buffers=llama()[1][:1],
        ),
        "MAX_LAYOUT_BUFFERS",
    ),
    "src_base_ptrs": (
        lambda: transfer_descriptors([], endless(0), [0], [0], [0]),  # type: ignore[arg-type]
        "MAX_LAYOUT_BUFFERS",
    ),
    "layer_kinds": (
        lambda: model_buffer_layouts(
            ModelShape(layer_kinds=endless(ModelShape.preset("llama-3-8b").model_layers[0])),  # type: ignore[arg-type]
            1,
            1,
        ),
        "MAX_LAYERS",
    ),
    "CacheBuffers.of": (
        lambda: CacheBuffers.of(
            endless(buffer_from_array(0, "target_k", CACHE, AXES, logical_size=8))
        ),  # type: ignore[arg-type]
        "MAX_LAYOUT_BUFFERS",
    ),
    "unavailable ranks": (
        lambda: PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 2),
            decode_layout=ParallelLayout("decode", 1),
            prefill_buffers=llama()[0],
            decode_buffers=llama()[1],
        ).without_prefill_ranks(endless(0)),  # type: ignore[arg-type]
        "name each unavailable rank once",
    ),
}


@pytest.mark.parametrize("call", list(ENDLESS), ids=list(ENDLESS))
def test_an_endless_iterable_is_refused_at_its_bound(call: str) -> None:
    run, says = ENDLESS[call]
    with pytest.raises(UnsupportedPDLayoutError, match=says):
        run()


def test_a_long_string_of_a_caller_is_cut_in_the_message() -> None:
    long = "x" * (1 << 20)
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        ParallelLayout("prefill", 2, cp_split=long)  # type: ignore[arg-type]
    message = str(refused.value)
    assert len(message) < SHORT and f"({1 << 20} bytes)" in message, message[:SHORT]
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        ParallelLayout("prefill", long)  # type: ignore[arg-type]
    assert len(str(refused.value)) < SHORT


def test_a_1_mib_peer_frame_makes_a_short_message() -> None:
    prefill, _ = llama()
    version, payload = encode_layout(ParallelLayout("prefill", 2), prefill[:1])
    peer = json.loads(payload)
    peer["buffers"][0]["buffer_kind"] = "k" * (1 << 20)
    frame = json.dumps(peer).encode()
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        decode_layout(version, frame, max_payload_bytes=len(frame))
    assert len(str(refused.value)) < SHORT, len(str(refused.value))
    # A fragment frame the same way: a 1 MiB kind in one fragment.
    fragments = llama_planner().plan_for_decode_rank(0).fragments_by_prefill_rank[0][:1]
    version, payload = encode_transfer_fragments(fragments)
    text = payload.decode().replace('"target_k"', json.dumps("k" * (1 << 20)), 1)
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        PreparedTransfer.from_frames(version, text.encode(), [0] * 64, [0] * 64)
    assert len(str(refused.value)) < SHORT, len(str(refused.value))


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        (10**100, "1000000000"),
        (2**64, "18446744073709551616"),
        (-(2**70), "-1180591620717411303424"),
        (10**5000, "an int of 16610 bits"),
    ],
    ids=["10**100", "2**64", "-2**70", "10**5000"],
)
def test_numbers_are_reported_as_given(given: int, shown: str) -> None:
    planner = llama_planner()
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        planner.plan_for_decode_rank(given)
    message = str(refused.value)
    assert shown in message and len(message) < SHORT, message
    assert str(2**127 - 1) not in message
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        ParallelLayout("prefill", given)
    message = str(refused.value)
    assert shown in message and "floating" not in message and len(message) < SHORT, message


def test_the_bounds_named_are_the_public_ones() -> None:
    assert limits.MAX_ARRAY_AXES == 8 and limits.MAX_LAYOUT_BUFFERS == 1 << 16


def test_the_runtime_helpers_refuse_bad_input_by_name() -> None:
    """The adapters' own entry points answer wrong values with the one error, naming the
    argument, never numpy's ValueError or a TypeError from deep inside."""
    from types import SimpleNamespace

    from pdplan import page_parts
    from pdplan.runtimes import sglang, vllm

    rules = vllm.conventions(block_size=16)
    pool = SimpleNamespace(full_to_swa_index_mapping=np.zeros(9, dtype=np.int64))
    kv = np.zeros((2, 2, 4, 1, 4), np.float16)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: rules.pages(["a"]), "block_ids must be integers"),
        (lambda: rules.pages([[1]]), "block_ids must be 1-D"),
        (lambda: rules.pages(np.array([2**63], dtype=np.uint64)), "past 2"),
        (lambda: vllm.conventions(block_size="16"), "block_size must be an int"),  # type: ignore[arg-type]
        (lambda: vllm.buffers(5, backend="FLASH_ATTN", tp_size=1, num_kv_heads=1), "iterable"),  # type: ignore[arg-type]
        (lambda: CacheBuffers.of(5), "entries must be an iterable"),  # type: ignore[arg-type]
        (lambda: page_parts(np.zeros((2, 4), np.uint8), 2, ("a",)), "must be ints"),  # type: ignore[arg-type]
        (lambda: sglang.swa_slots(pool, ["x"]), "slots must be integers"),
        (
            lambda: vllm.buffers(
                {"model.layers.0.attn": kv}, backend="FLASH_ATTN", tp_size=1, num_kv_heads={0: "x"}
            ),  # type: ignore[dict-item]
            "must be an int",
        ),
    ]
    for run, says in cases:
        with pytest.raises(UnsupportedPDLayoutError, match=says):
            run()


def layout_frame() -> tuple[bytes, dict]:
    prefill, _ = llama()
    version, payload = encode_layout(ParallelLayout("prefill", 2), prefill[:2])
    return version, json.loads(payload)


def layout_refusal(version: bytes, frame: dict) -> str:
    text = json.dumps(frame).encode()
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        decode_layout(version, text, max_payload_bytes=len(text))
    return str(refused.value)


@pytest.mark.parametrize("where", ["top", "buffer"])
def test_a_peer_s_long_text_is_cut_in_any_field_known_or_not(where: str) -> None:
    version, frame = layout_frame()
    long = "x" * 900_000
    for spoil in (
        lambda p: p.__setitem__(long, 1),  # an unknown 900 kB key
        lambda p: p.__setitem__("world_size" if where == "top" else "page_size", long),
        lambda p: p.__setitem__("pp_layer_partition" if where == "top" else "layer", [long]),
        lambda p: p.__setitem__('a`\\"' * 200_000, 1),  # quotes and backquotes in a key
    ):
        spoilt = json.loads(json.dumps(frame))
        spoil(spoilt if where == "top" else spoilt["buffers"][1])
        message = layout_refusal(version, spoilt)
        assert len(message) < 1200, (len(message), message[:SHORT])
        assert "not a valid layout" in message


@pytest.mark.parametrize(
    "written",
    ["18446744073709551616", "1e100", "1" + "0" * 100, "340282366920938463463374607431768211456"],
)
def test_a_peer_s_numbers_are_reported_as_written(written: str) -> None:
    version, frame = layout_frame()
    for path in (("world_size",), ("buffers", 1, "logical_size"), ("base_ptrs",)):
        text = json.dumps(frame)
        if path == ("base_ptrs",):
            text = text.replace('"base_ptrs": null', f'"base_ptrs": [0, {written}]')
        else:
            target = frame if len(path) == 1 else frame["buffers"][1]
            marker = "@@@"
            target[path[-1]], saved = marker, target[path[-1]]
            text = json.dumps(frame).replace(f'"{marker}"', written)
            target[path[-1]] = saved
        with pytest.raises(UnsupportedPDLayoutError) as refused:
            decode_layout(version, text.encode(), max_payload_bytes=len(text))
        message = str(refused.value)
        assert f"`{written}`" in message, (path, message)
        assert "floating" not in message and "e+19" not in message and "e19" not in message
    # A fragment frame the same way.
    fragments = llama_planner().plan_for_decode_rank(0).fragments_by_prefill_rank[0][:1]
    version, payload = encode_transfer_fragments(fragments)
    spoilt = json.loads(payload)
    spoilt[0]["bytes_per_page"] = "@@@"
    text = json.dumps(spoilt).replace('"@@@"', written)
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        PreparedTransfer.from_frames(version, text.encode(), [0] * 64, [0] * 64)
    message = str(refused.value)
    assert f"`{written}`" in message and "floating" not in message, message


def test_a_config_s_numbers_are_reported_as_written(tmp_path: Path) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "num_hidden_layers": "@@@", "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "torch_dtype": "bfloat16"}  # fmt: skip
    for written in ("18446744073709551616", "1" + "0" * 100):
        file = tmp_path / "config.json"
        file.write_text(json.dumps(config).replace('"@@@"', written))
        with pytest.raises(UnsupportedPDLayoutError) as refused:
            ModelShape.from_hf_config(file, page_size=16)
        message = str(refused.value)
        assert written in message and "e+" not in message and len(message) < SHORT, message


def test_python_side_messages_are_bounded() -> None:
    from pdplan.session._protocol import check_identity

    long = "y" * (1 << 20)
    peer = json.dumps({"model": long, long: 2**64}).encode()
    for own in ({"model": "tiny"}, {"model": long}):
        with pytest.raises(UnsupportedPDLayoutError) as refused:
            check_identity(own, peer, "prefill")
        assert len(str(refused.value)) < SHORT, len(str(refused.value))
    plan = llama_planner().plan_for_decode_rank(0)
    for given, says in ((long, "(1048576 characters)"), (10**100, str(10**100))):
        with pytest.raises(UnsupportedPDLayoutError) as refused:
            plan.required_dst_info_num_for_prefill_rank(given)  # type: ignore[arg-type]
        message = str(refused.value)
        assert len(message) < SHORT and says in message, message[:SHORT]
