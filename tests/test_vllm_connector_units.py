"""The vLLM connector's parts that need no engine: the version gate, the settings reader and
the identity check (the real-engine tests are tests/vllm_engine)."""

from __future__ import annotations

import importlib
import json
import sys
import types

import pytest

from pdplan import UnsupportedPDLayoutError


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0", "garbage"])
def test_a_vllm_outside_the_tested_range_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__=version))
    for name in [m for m in sys.modules if m.startswith("pdplan.connectors.vllm")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(UnsupportedPDLayoutError, match=r"vLLM >= 0\.32, < 0\.33; this is vLLM"):
        importlib.import_module("pdplan.connectors.vllm")


def test_settings_take_known_keys_and_refuse_others() -> None:
    from pdplan.connectors._settings import Settings

    assert Settings.of(None).engine == "nixl"
    assert Settings.of({"kv_lease_seconds": 5}).kv_lease_seconds == 5.0
    with pytest.raises(UnsupportedPDLayoutError, match=r"does not read: \['enigne'\]"):
        Settings.of({"enigne": "mooncake"})
    with pytest.raises(UnsupportedPDLayoutError, match=r"side_channel_port=True must be a int"):
        Settings.of({"side_channel_port": True})
    with pytest.raises(UnsupportedPDLayoutError, match=r"not a TCP port"):
        Settings.of({"side_channel_port": 70000})


def test_an_identity_that_differs_is_refused_naming_the_first_field() -> None:
    from pdplan.connectors._identity import check_identity

    own = {"model": "m", "dtype": "float32", "num_layers": 2}
    check_identity(own, json.dumps(own).encode(), "decode")
    other = json.dumps({**own, "dtype": "bfloat16", "num_layers": 3}).encode()
    with pytest.raises(UnsupportedPDLayoutError, match=r"differs in dtype: 'bfloat16' there"):
        check_identity(own, other, "decode")
    with pytest.raises(UnsupportedPDLayoutError, match=r"over 4 KiB"):
        check_identity(own, b"x" * 5000, "prefill")
    with pytest.raises(UnsupportedPDLayoutError, match=r"not JSON"):
        check_identity(own, b"{", "prefill")


GOOD = {"remote_engine_id": "e", "remote_request_id": "r", "remote_host": "127.0.0.1",
        "remote_port": 5600, "tp_size": 2, "remote_block_ids": [[3, 4]]}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("remote_port", 70000, r"remote_port must be an integer in \[1, 65535\]"),
        ("remote_port", "5600", r"remote_port must be an integer"),
        ("tp_size", True, r"tp_size must be an integer"),
        ("tp_size", 10**9, r"tp_size must be an integer in \[1, "),
        ("remote_host", "h" * 1000, r"remote_host must be a string of 1 to 256"),
        ("remote_engine_id", None, r"remote_engine_id must be a string"),
    ],
)
def test_a_peer_s_transfer_params_are_read_strictly(key: str, value: object, message: str) -> None:
    """They come from a client through a proxy: a bad value is refused naming its key."""
    from pdplan.connectors._transfer_params import remote_of

    assert remote_of(GOOD).port == 5600
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        remote_of({**GOOD, key: value})


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
    from pdplan.connectors._transfer_params import block_groups

    assert block_groups([5, 6]) == ((5, 6),)
    assert block_groups([[5], [7, 8]]) == ((5,), (7, 8))
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        block_groups(blocks)
