"""A decode rank reads around a prefill rank that does not answer, where another holds the
same bytes: the connector's prefill and decode ranks in this process, over their real side
channel (ZeroMQ on loopback), with vLLM's CPU cache shape in numpy memory and a loopback
engine that copies descriptors with ctypes. One KV head at prefill TP 2: both prefill ranks
hold it (a replica group), so with rank 0 silent every byte comes from rank 1 (the oracle:
rank 1's own pages, filled differently from rank 0's), and rank 1 hears "done"."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np
import pytest

from pdplan.runtimes import vllm as vllm_adapter

# Importing the connector imports vLLM, and torch warns of its own deprecations on the way.
pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

BLOCKS, BLOCK, HEAD = 8, 32, 16


class Loopback:
    """An engine in one process: a read is a memmove, done at once."""

    def register(self, regions: list[tuple[int, int]]) -> None:
        return None

    def metadata(self) -> bytes:
        return b"loopback"

    def read(self, peer: bytes, local: Any, remote: Any, lengths: Any) -> Any:
        for dst, src, n in zip(local.tolist(), remote.tolist(), lengths.tolist()):
            ctypes.memmove(dst, src, n)
        return "done"

    def state(self, handle: Any) -> str:
        return "DONE"

    def close(self) -> None:
        return None


def worker_cache(tensor: np.ndarray, tp: int) -> Any:
    from pdplan.connectors.vllm._caches import GroupCache, WorkerCache
    from pdplan.runtimes._vllm_groups import CacheGroup

    layer = "model.layers.0.self_attn.attn"
    cache = vllm_adapter.buffers({layer: tensor}, backend="CPU_ATTN", tp_size=tp, num_kv_heads=1)
    # One full-attention group owning every buffer, its blocks one page each.
    group = CacheGroup("attention", "FullAttentionSpec", BLOCK, (layer,))
    rules = vllm_adapter.conventions(block_size=BLOCK, kernel_block_size=BLOCK)
    owned = GroupCache(group, tuple(range(len(cache.buffers))), rules)
    identity = {"model": "tiny", "dtype": "float32", "cache_dtype": "auto", "num_layers": 1}
    return WorkerCache(cache, (owned,), identity, "LlamaForCausalLM")


def test_a_silent_prefill_rank_is_read_around_from_its_replica() -> None:
    from pdplan.connectors._transfer_params import Remote
    from pdplan.connectors.vllm._decode import DecodeRank
    from pdplan.connectors.vllm._metadata import Receive
    from pdplan.connectors.vllm._prefill import PrefillRank

    rng = np.random.default_rng(4)
    # vLLM's CPU cache: (blocks, kv_heads on the rank, block_size, 2 * head_size).
    prefill = [rng.standard_normal((BLOCKS, 1, BLOCK, 2 * HEAD)).astype(np.float32)
               for _ in range(2)]  # fmt: skip
    decode = np.zeros((BLOCKS, 1, BLOCK, 2 * HEAD), np.float32)
    engine = Loopback()
    port = 6900
    ranks = [PrefillRank(worker_cache(t, 2), r, 2, engine, "127.0.0.1", port)
             for r, t in enumerate(prefill)]  # fmt: skip
    ranks[0].close()  # rank 0 is gone: it answers nothing
    puller = DecodeRank(worker_cache(decode, 1), 0, 1, engine, 0.5, 10.0)
    try:
        remote = Remote("prefill", "req-1", "127.0.0.1", port, 2)
        ranks[1].lease({"req-1": time.time() + 60})
        puller.start([Receive("req-1", ((4, 6),), ((1, 3),), remote)])
        puller.poll()
        done, failed, lost = puller.take_finished()
        assert (done, failed, lost) == ({"req-1"}, set(), set())
        np.testing.assert_array_equal(decode[[4, 6]], prefill[1][[1, 3]])
        assert not decode[[0, 1, 2, 3, 5, 7]].any()
        deadline = time.monotonic() + 10
        while "req-1" not in ranks[1].freed():
            assert time.monotonic() < deadline, "rank 1 never heard done"
            time.sleep(0.05)
    finally:
        puller.close()
        ranks[1].close()
