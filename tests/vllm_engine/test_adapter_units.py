"""vLLM's adapter's parts that need no engine: ``kv_transfer_params`` read strictly (they come
from a client through a proxy) and a streaming prefill request's progress from vLLM's
scheduler output. Run by scripts/test_vllm.sh (CI), which installs vLLM."""

from __future__ import annotations

import json
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdplan import UnsupportedPDLayoutError
from pdplan.limits import MAX_TOKENS, MAX_WORLD_SIZE

pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


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
        # A side-channel line's separators (a hold or done line would split on them).
        ("remote_request_id", "a\tb", r"remote_request_id must be .* none a control character"),
        ("remote_host", "h\n", r"remote_host must be .* none a control character"),
        ("remote_registration_generation", -1, r"remote_registration_generation must be an "),
        ("remote_registration_generation", True, r"remote_registration_generation must be "),
        ("remote_registration_generation", "2", r"remote_registration_generation must be "),
        ("remote_registration_generation", 1 << 40, r"generation must be an integer in \[0, "),
        ("dcp_size", 4, r"dcp_size=4: PdplanConnector reads prefill instances without decode "),
        # A pipeline of stages is read (its ranks TP x PP), within the bound on ranks.
        ("pp_size", 2**20, r"pp_size must be an integer in \[1, 524288\]"),
        ("pp_size", [2], r"pp_size must be an integer"),
    ],
)
def test_a_peer_s_transfer_params_are_read_strictly(key: str, value: object, message: str) -> None:
    """They come from a client through a proxy: a bad value is refused naming its key."""
    from pdplan.connectors.vllm._transfer_params import remote_of

    assert remote_of(GOOD).port == 5600
    assert remote_of(GOOD).generation == 0  # a 0.32 prefill side names none
    assert remote_of({**GOOD, "remote_registration_generation": 3}).generation == 3
    assert remote_of({**GOOD, "pp_size": 2}).ranks == 4  # TP 2 x PP 2, each on port + rank
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        remote_of({**GOOD, key: value})


#: Each key's values on both sides of each of its bounds, and of the wrong types.
_TEXTS = ["e", "", "x" * 256, "x" * 257, "a\tb", "h\n", "\x7f", "\x1f", "é", 5, None]
_MAX_WORLD, _MAX_GENERATION, _MAX_TOKENS = MAX_WORLD_SIZE, (1 << 31) - 1, MAX_TOKENS
EDGES = {
    "remote_engine_id": _TEXTS, "remote_request_id": _TEXTS, "remote_host": _TEXTS,
    "remote_port": [0, 1, 65535, 65536, -1, True, "5600", 5600.0, None],
    "tp_size": [0, 1, 2, _MAX_WORLD, _MAX_WORLD + 1, True, None, "2"],
    "pp_size": [0, 1, 2, _MAX_WORLD // 2, _MAX_WORLD // 2 + 1, _MAX_WORLD, True, [2]],
    "dcp_size": [0, 1, 2, True, None, 1.0],
    "remote_registration_generation": [-1, 0, 3, _MAX_GENERATION, _MAX_GENERATION + 1, True,
                                       "2", None],
    "remote_num_tokens": [-1, 0, 40, _MAX_TOKENS, _MAX_TOKENS + 1, True, None, "40"],
    "remote_block_ids": [[], [[]], [[0]], [[-1]], [[True]], [[1.0]], [1, 2], [[1], [2]], "x",
                         [[1]] * 65, None, [[1, 2], 3], [(1, 2)], ((1, 2),)],
    "stream_id": [None, "s", "", "a\nb", 5],
}  # fmt: skip


@settings(max_examples=1500, deadline=None)
@given(st.data())
def test_params_read_the_short_way_as_key_by_key(data: st.DataObject) -> None:
    """Read once a request on vLLM's scheduling thread, the params every sender writes take a
    short way: it reads what the key-by-key reader (whose refusals are tested above) reads,
    and refuses what it refuses, with its message."""
    from pdplan.connectors.vllm._transfer_params import pull_of, strict_pull_of

    keys = data.draw(st.sets(st.sampled_from(sorted(EDGES)), max_size=3))
    changed = {key: data.draw(st.sampled_from(EDGES[key])) for key in sorted(keys)}
    dropped = data.draw(st.sets(st.sampled_from(sorted(EDGES)), max_size=2))
    params = {k: v for k, v in {**GOOD, "remote_num_tokens": 40, **changed}.items()
              if k not in dropped}  # fmt: skip
    try:
        expected = strict_pull_of(params)
    except UnsupportedPDLayoutError as error:
        with pytest.raises(UnsupportedPDLayoutError) as raised:
            pull_of(params)
        assert str(raised.value) == str(error)
        return
    assert pull_of(params) == expected


def test_a_streaming_prefill_request_s_progress_follows_its_chunks() -> None:
    """The scheduler side's progress: blocks as vLLM hands them out chunk by chunk (new
    requests' whole lists, cached requests' additions), final tokens after each step."""
    from pdplan.connectors.vllm._stream_tracker import StreamTracker

    side = StreamTracker()
    side.add("r", "s", ([7, 8],), 150)
    first = types.SimpleNamespace(
        num_scheduled_tokens={"r": 64},
        scheduled_new_reqs=[types.SimpleNamespace(req_id="r", block_ids=([7, 8],),
                                                  num_computed_tokens=0)],
        scheduled_cached_reqs=None,
    )  # fmt: skip
    progress = side.step(first)["s"]
    assert (progress.request_id, progress.blocks, progress.final_tokens) == ("r", ((7, 8),), 64)
    assert progress.final_length == 150
    cached = types.SimpleNamespace(
        req_ids=["r"], resumed_req_ids=set(), new_block_ids=[([9, 10, 11],)],
        num_computed_tokens=[128],
    )  # fmt: skip
    last = types.SimpleNamespace(
        num_scheduled_tokens={"r": 64}, scheduled_new_reqs=[], scheduled_cached_reqs=cached
    )
    progress = side.step(last)["s"]
    # Capped at the prompt: the step's 64 tokens past 128 end at 150.
    assert (progress.blocks, progress.final_tokens) == (((7, 8, 9, 10, 11),), 150)
    # A request not scheduled this step makes no progress.
    idle = types.SimpleNamespace(num_scheduled_tokens={}, scheduled_new_reqs=[],
                                 scheduled_cached_reqs=None)  # fmt: skip
    assert side.step(idle) == {}
    assert side.drop("r") and not side.drop("r")


def test_a_streamed_decode_request_names_its_stream_and_prefill_side() -> None:
    from pdplan.connectors.vllm._transfer_params import stream_of, streamed_remote_of

    params = {"stream_id": "s-1", "remote_engine_id": "e", "remote_host": "h",
              "remote_port": 5600, "tp_size": 2}  # fmt: skip
    assert stream_of(params) == "s-1" and stream_of({}) is None
    assert streamed_remote_of(params).request_id == "s-1"
    with pytest.raises(UnsupportedPDLayoutError, match="stream_id must be a string"):
        stream_of({"stream_id": ""})
    with pytest.raises(UnsupportedPDLayoutError, match=r"stream_id .* none a control character"):
        stream_of({"stream_id": "a\nb"})
    with pytest.raises(UnsupportedPDLayoutError, match="remote_port"):
        streamed_remote_of({**params, "remote_port": 0})


class _DeviceTensor:
    """A tensor as ``regions`` reads it (its device, its storage's address and size): no
    CUDA device is lent to this machine, so a device cache is described, not allocated."""

    def __init__(self, kind: str, index: int | None, address: int, size: int) -> None:
        self.device = types.SimpleNamespace(type=kind, index=index)
        self._storage = types.SimpleNamespace(data_ptr=lambda: address, nbytes=lambda: size)

    def untyped_storage(self) -> types.SimpleNamespace:
        return self._storage


def test_a_device_cache_registers_where_it_lives() -> None:
    from pdplan.connectors.vllm._caches import regions
    from pdplan.session import HOST, Memory

    cuda = {
        "model.layers.0.self_attn.attn": _DeviceTensor("cuda", 1, 0x7F00_0000, 4096),
        # A layer viewing the same storage (KV sharing) registers it once.
        "model.layers.1.self_attn.attn": _DeviceTensor("cuda", 1, 0x7F00_0000, 4096),
        "model.layers.2.self_attn.attn": [_DeviceTensor("cuda", 1, 0x7F10_0000, 8192)],
    }
    assert regions(cuda, "cuda") == ([(0x7F00_0000, 4096), (0x7F10_0000, 8192)], Memory("VRAM", 1))
    host = {"model.layers.0.self_attn.attn": _DeviceTensor("cpu", None, 0x1000, 64)}
    assert regions(host, "cpu") == ([(0x1000, 64)], HOST)
    # No staging buffers: kv_buffer_device must be the cache's own device.
    with pytest.raises(UnsupportedPDLayoutError, match="set kv_buffer_device to 'cuda'"):
        regions(cuda, "cpu")
    with pytest.raises(UnsupportedPDLayoutError, match="spans devices"):
        regions({**cuda, "x": _DeviceTensor("cuda", 0, 0x9000, 64)}, "cuda")


def test_stages_number_their_buffers_as_one_rank_holding_every_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hybrid of attention and Mamba2 layers split over two pipeline stages: each stage's
    rank, after the gather, describes the whole model's buffers exactly as one rank holding
    every layer does (every KV in model order, then every state), its own addresses at its
    own buffers and zero at the other stage's."""
    import numpy as np
    import torch.distributed as dist

    import pdplan
    from pdplan import Mamba2Layer
    from pdplan.connectors.vllm._stages import whole_model
    from pdplan.runtimes import vllm
    from pdplan.session import GroupCache, WorkerCache

    specs = pdplan.state_specs(Mamba2Layer(heads=4, head_dim=2, state_size=3, groups=2))
    names = ["model.layers.0.self_attn.attn", "model.layers.1.mixer",
             "model.layers.2.self_attn.attn", "model.layers.3.mixer"]  # fmt: skip
    tensors = {
        name: [np.zeros((6, 3, 20), np.float16), np.zeros((6, 4, 2, 3), np.float32)]
        if name.endswith("mixer")
        else np.zeros((6, 2, 16, 2 * 8), np.float32)
        for name in names
    }

    def cache_of(chosen: list[str]) -> WorkerCache:
        cache = vllm.buffers({n: tensors[n] for n in chosen}, backend="CPU_ATTN", tp_size=1,
                             num_kv_heads=2, states=specs)  # fmt: skip
        rules = vllm.conventions(block_size=16)
        kv = tuple(b.buffer_index for b in cache.buffers if b.buffer_kind.value != "mamba_state")
        state = tuple(b.buffer_index for b in cache.buffers if b.buffer_kind.value == "mamba_state")
        return WorkerCache(cache, (GroupCache(kv, rules), GroupCache(state, rules, state=True)),
                           {"num_layers": len(chosen)}, "hybrid")  # fmt: skip

    stages = [cache_of(names[:2]), cache_of(names[2:])]
    whole = cache_of(names).cache
    from pdplan._exchange import encode_layout

    refusing: set[int] = set()

    def gather(out: list[object], own: object, group: object) -> None:
        for stage, cache in enumerate(stages):
            out[stage] = (stage, "", *encode_layout(pdplan.ParallelLayout("prefill", 1),
                                                    cache.cache.buffers), 2)  # fmt: skip
            if stage in refusing:
                out[stage] = (stage, "no such cache", b"", b"", 0)
        out[own[0]] = own if own[1] else out[own[0]]  # type: ignore[index]

    monkeypatch.setattr(dist, "all_gather_object", gather)
    group = types.SimpleNamespace(world_size=2, cpu_group=None)
    for stage, cache in enumerate(stages):
        mine = whole_model(lambda cache=cache: cache, stage, group)
        assert mine.cache.buffers == whole.buffers
        assert mine.identity["num_layers"] == 4
        held = {i for g in mine.groups for i in g.buffers}
        for index, (base, wanted) in enumerate(zip(mine.cache.base_ptrs, whole.base_ptrs)):
            assert base == (wanted if index in held else 0)
        assert {whole.buffers[i].layer for i in held} == {2 * stage, 2 * stage + 1}
    # One stage refused: every stage raises, naming it, none waits for the others.
    refusing.add(1)

    def refused() -> WorkerCache:
        raise pdplan.UnsupportedPDLayoutError("no such cache")

    for stage, cache in enumerate(stages):
        with pytest.raises(pdplan.UnsupportedPDLayoutError, match="pipeline stage 1: no such"):
            whole_model(refused if stage == 1 else lambda cache=cache: cache, stage, group)
    # Any error of a stage's own, not only a refusal, reaches it as a refusal naming it.
    refusing.clear()

    def broken() -> WorkerCache:
        raise KeyError("model.layers.0")

    with pytest.raises(pdplan.UnsupportedPDLayoutError, match=r"stage 0: KeyError: 'model\.lay"):
        whole_model(broken, 0, group)


def test_two_cpu_attention_kernels_are_refused_at_the_handshake() -> None:
    """vLLM's CPU attention picks its kernel by the host (AMX tiles for bf16 blocks of 32's
    multiples, else ``vec``); the two lay out one block size's tokens otherwise, so ranks of
    two kernels must not pair, whatever else matches."""
    from pdplan.connectors.vllm._caches import identity
    from pdplan.runtimes._vllm_groups import CacheGroup
    from pdplan.session._protocol import check_identity

    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model="/models/tiny-llama", dtype="torch.bfloat16"),
        cache_config=types.SimpleNamespace(cache_dtype="auto"),
    )
    groups = [CacheGroup("attention", "FullAttentionSpec", 32, ("model.layers.0.self_attn.attn",))]
    amx, vec = identity(config, 1, groups, "amx"), identity(config, 1, groups, "vec")
    check_identity(amx, json.dumps(amx).encode(), "decode")
    with pytest.raises(UnsupportedPDLayoutError, match=r"attention_kernel: 'vec' there"):
        check_identity(amx, json.dumps(vec).encode(), "decode")
