"""The transfer session's parts that need no engine or peer: the settings reader, the identity
check, the protocol's progress replies and the slices a stream reads; and the vLLM connector's
version gate (vLLM's own adapter units: tests/vllm_engine/test_adapter_units.py)."""

from __future__ import annotations

import importlib
import json
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdplan import UnsupportedPDLayoutError


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0", "1.0.0", "garbage"])
def test_a_vllm_outside_the_tested_range_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__=version))
    for name in [m for m in sys.modules if m.startswith("pdplan.connectors.vllm")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(UnsupportedPDLayoutError, match=r"vLLM >= 0\.32, < 0\.35; this is vLLM"):
        importlib.import_module("pdplan.connectors.vllm")


def test_settings_take_known_keys_and_refuse_others() -> None:
    from pdplan.session._settings import Settings

    assert Settings.of(None).engine == "nixl"
    assert Settings.of({"kv_lease_seconds": 5}).kv_lease_seconds == 5.0
    with pytest.raises(UnsupportedPDLayoutError, match=r"does not read: \['enigne'\]"):
        Settings.of({"enigne": "mooncake"})
    with pytest.raises(UnsupportedPDLayoutError, match=r"side_channel_port=True must be a int"):
        Settings.of({"side_channel_port": True})
    with pytest.raises(UnsupportedPDLayoutError, match=r"not a TCP port"):
        Settings.of({"side_channel_port": 70000})


def test_an_identity_that_differs_is_refused_naming_the_first_field() -> None:
    from pdplan.session._protocol import check_identity

    own = {"model": "m", "dtype": "float32", "num_layers": 2}
    check_identity(own, json.dumps(own).encode(), "decode")
    other = json.dumps({**own, "dtype": "bfloat16", "num_layers": 3}).encode()
    with pytest.raises(UnsupportedPDLayoutError, match=r"differs in dtype: 'bfloat16' there"):
        check_identity(own, other, "decode")
    with pytest.raises(UnsupportedPDLayoutError, match=r"over 4 KiB"):
        check_identity(own, b"x" * 5000, "prefill")
    with pytest.raises(UnsupportedPDLayoutError, match=r"not JSON"):
        check_identity(own, b"{", "prefill")


def test_a_peer_s_state_slots_pair_whatever_its_blocks_hold() -> None:
    """A state group's block is vLLM's ``max_model_len`` tokens, one slot a request: two
    instances of other context lengths pair its slots as pages; only attention blocks of other
    token counts move by token maps, and a state block split into pages is refused."""
    import numpy as np

    from pdplan.runtimes import vllm as vllm_adapter
    from pdplan.session import GroupCache, LayoutRefused, WorkerCache

    layer = "model.layers.0.self_attn.attn"
    cache = vllm_adapter.buffers({layer: np.zeros((4, 1, 16, 8), np.float32)},
                                 backend="CPU_ATTN", tp_size=1, num_kv_heads=1)  # fmt: skip
    kv = GroupCache((0,), vllm_adapter.conventions(block_size=16, kernel_block_size=16))
    state = GroupCache((), vllm_adapter.conventions(block_size=4096, kernel_block_size=4096), True)
    own = WorkerCache(cache, (kv, state), {}, "hybrid", whole_pages="its pages are tiles")
    assert not own.token_maps(own.peer_rules(((16, 16), (8192, 8192))))
    tokens = WorkerCache(cache, (kv, state), {}, "hybrid")  # its pages move token by token
    assert tokens.token_maps(tokens.peer_rules(((32, 16), (4096, 4096))))
    with pytest.raises(LayoutRefused, match=r"blocks differ .* its pages are tiles"):
        own.peer_rules(((32, 16), (4096, 4096)))
    with pytest.raises(LayoutRefused, match=r"state group 1 splits a block into pages"):
        own.peer_rules(((16, 16), (8192, 16)))


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        ("1,2", r"must be a list"),
        ([[1, -2]], r"non-negative integers"),
        ([[1, 2.0]], r"non-negative integers"),
        ([[1], "x"], r"lists of at most"),
        ([[1]] * 65, r"over 64 KV cache groups"),
    ],
)
def test_block_ids_must_be_lists_of_non_negative_ints(blocks: object, message: str) -> None:
    from pdplan.session._requests import block_groups

    assert block_groups([5, 6]) == ((5, 6),)
    assert block_groups([[5], [7, 8]]) == ((5,), (7, 8))
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        block_groups(blocks)


def test_a_peer_s_progress_reply_is_read_strictly() -> None:
    from pdplan.session._protocol import notices_of

    good = {"s": ["req-1", [[3, 4]], 64, 150]}
    notice = notices_of([json.dumps(good).encode()])["s"]
    assert (notice.request_id, notice.blocks, notice.final_tokens) == ("req-1", ((3, 4),), 64)
    assert notices_of([b"{}"]) == {}
    for reply, message in [
        ([b"{"], "does not parse"),
        ([b"[]"], "one object of streams"),
        ([b"{}", b"{}"], "not one JSON object"),
        ([b"x" * (5 << 20)], "not one JSON object"),
        ([json.dumps({"s": ["r", [[1]], 9]}).encode()], "request, blocks, tokens, length"),
        ([json.dumps({"s": ["r", [[1]], 9, 8]}).encode()], "0 <= final <= length"),
        ([json.dumps({"s": ["r", [[-1]], 1, 8]}).encode()], "non-negative"),
        ([json.dumps({"s": ["r", [[1]], True, 8]}).encode()], "0 <= final <= length"),
        ([json.dumps({"s": ["r", [[1]], 4, 8, [3, [0]]]}).encode()], "final <= tokens"),
        ([json.dumps({"s": ["r", [[1]], 4, 8, [9, [0]]]}).encode()], "final <= tokens"),
        ([json.dumps({"s": ["r", [[1]], 4, 8, [6, [-1]]]}).encode()], "final <= tokens"),
        ([json.dumps({"s": ["r", [[1]], 4, 8, [6, [True]]]}).encode()], "final <= tokens"),
        ([json.dumps({"s": ["r", [[1]], 4, 8, [6, 0]]}).encode()], "final <= tokens"),
        ([json.dumps({"s": ["r", [[1]], 4, 8, [6, list(range(5000))]]}).encode()], "tokens"),
    ]:
        with pytest.raises(UnsupportedPDLayoutError, match=message):
            notices_of(reply)


def test_a_step_s_saved_layers_travel_with_its_progress() -> None:
    from pdplan.session._progress import Progress
    from pdplan.session._protocol import encode_progress, notices_of

    running = Progress("req-1", ((3, 4),), 64, 150, ahead=(128, (1, 0)))
    (back,) = notices_of([encode_progress({"s": running})]).values()
    assert back.ahead == (128, (0, 1)) and back.final_tokens == 64
    plain = Progress("req-1", ((3, 4),), 64, 150)
    assert notices_of([encode_progress({"s": plain})])["s"] == plain


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.integers(1, 90), st.data())
def test_layer_slices_read_each_layer_s_tokens_once_and_only_once_final(
    num_layers: int, length: int, data: st.DataObject
) -> None:
    """A stream's notices, step by step (chunks of random sizes), each step's layers saved
    one by one while it runs, every notice seen or missed at random, some seen twice, the
    decode side's buffers knowing every layer or none: the slices read every (layer, token)
    of the prompt exactly once, none before that layer's forward pass made it final."""
    from pdplan.session._progress import Progress, next_slices

    layers = tuple(range(num_layers))
    known = layers if data.draw(st.booleans(), label="layers known") else None
    reads = [[0] * length for _ in layers]
    read_to, ahead = 0, {}
    done = 0
    seen_last: Progress | None = None

    def see(notice: Progress) -> None:
        nonlocal read_to, ahead
        slices, read_to, ahead = next_slices(read_to, ahead, notice, known)
        for chosen, start, stop in slices:
            for layer in layers if chosen is None else chosen:
                final = notice.final_tokens
                if notice.ahead is not None and layer in notice.ahead[1]:
                    final = notice.ahead[0]
                assert stop <= final, "a slice reads tokens its layer has not made final"
                for t in range(start, stop):
                    reads[layer][t] += 1

    while done < length:
        end = min(length, done + data.draw(st.integers(1, 40), label="chunk"))
        order = data.draw(st.permutations(layers), label="saved order")
        for k in range(1, len(order)):
            notice = Progress("r", (), done, length, ahead=(end, tuple(order[:k])))
            if data.draw(st.booleans(), label="seen"):
                see(notice)
                seen_last = notice
        done = end
        notice = Progress("r", (), done, length)
        if done == length or data.draw(st.booleans(), label="seen"):
            see(notice)
        if seen_last is not None and data.draw(st.booleans(), label="stale again"):
            see(seen_last)
    assert reads == [[1] * length for _ in layers]
