"""Buffer layouts from model shapes, presets, config.json files and item lengths."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest

from pdplan import (
    MODEL_PRESETS,
    AttentionLayer,
    BufferKind,
    ItemLengths,
    MlaLayer,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    UnsupportedPDLayoutError,
    buffer_layouts_from_item_lengths,
    model_buffer_layouts,
    vllm_layer_partition,
)

#: Presets whose Mamba2 layers have one group (n_groups=1), which runtimes replicate at TP > 1
#: and pdplan does not plan yet: they plan at TP 1 (and their refusal is tested below).
ONE_GROUP = {"falcon-h1-7b", "granite-4.0-h-small"}


def preset_tps(pairs: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
    return [
        (name, *tps)
        for name in MODEL_PRESETS
        for tps in (pairs if name not in ONE_GROUP else [(1, 1)])
    ]


@pytest.mark.parametrize(("name", "prefill_tp", "decode_tp"), preset_tps([(8, 2), (2, 8), (4, 4)]))
@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
def test_every_preset_plans_and_verifies(
    name: str, prefill_tp: int, decode_tp: int, kv_layout: Literal["HND", "NHD"]
) -> None:
    shape = ModelShape.preset(name)
    prefill, decode = model_buffer_layouts(shape, prefill_tp, decode_tp, kv_layout)
    assert len(prefill) == len(decode) > 0
    assert [b.buffer_index for b in prefill] == list(range(len(prefill)))
    for replicas in ("first", "all"):
        planner = PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", prefill_tp),
            decode_layout=ParallelLayout("decode", decode_tp),
            prefill_buffers=prefill,
            decode_buffers=decode,
            decode_replicas=replicas,  # type: ignore[arg-type]
        )
        planner.verify()


def test_nhd_pages_hold_the_same_bytes_in_rows() -> None:
    shape = ModelShape.preset("llama-3-8b")
    hnd, _ = model_buffer_layouts(shape, 4, 2)
    nhd, _ = model_buffer_layouts(shape, 4, 2, kv_layout="NHD")
    assert [b.rows_per_page for b in hnd] == [1] * len(hnd)
    assert [b.rows_per_page for b in nhd] == [16] * len(nhd)
    # The same item and unit sizes: only where the bytes sit differs.
    assert [(b.item_stride_bytes, b.bytes_per_logical_unit) for b in nhd] == [
        (b.item_stride_bytes, b.bytes_per_logical_unit) for b in hnd
    ]
    with pytest.raises(UnsupportedPDLayoutError, match="kv_layout must be 'HND' or 'NHD'"):
        model_buffer_layouts(shape, 4, 2, kv_layout="HDN")  # type: ignore[arg-type]


def test_llama_70b_buffers() -> None:
    prefill, decode = model_buffer_layouts(ModelShape.preset("llama-3-70b"), 16, 2)
    assert len(prefill) == 160
    unit = 16 * 128 * 2
    k = prefill[0]
    assert (k.buffer_kind, k.logical_axis, k.logical_size) == (BufferKind.TARGET_K, "kv_head", 8)
    assert (k.bytes_per_logical_unit, k.item_stride_bytes, k.tp_replica_group_size) == (
        unit,
        unit,
        2,
    )  # TP 16 over 8 heads: replica groups of 2
    assert (decode[1].buffer_kind, decode[1].item_stride_bytes) == (BufferKind.TARGET_V, 4 * unit)


def test_mla_mamba_and_draft_presets() -> None:
    mla, _ = model_buffer_layouts(ModelShape.preset("deepseek-v3", page_size=64), 8, 4)
    assert {b.logical_axis for b in mla} == {"replicated"}
    assert mla[0].item_stride_bytes == 64 * (512 + 64) * 2
    hybrid, _ = model_buffer_layouts(ModelShape.preset("nemotron-h-8b"), 4, 2)
    states = [b for b in hybrid if b.buffer_kind == BufferKind.MAMBA_STATE]
    # Each Mamba layer: its SSM state, then its conv state (x | B | C, each part sharded).
    assert len(states) == 48 and states[0].logical_axis == "state_channel"
    ssm, conv = states[0], states[1]
    assert ssm.logical_parts is None and conv.logical_parts == (8192, 1024, 1024)
    assert conv.item_stride_bytes == (8192 + 2 * 1024) // 4 * 3 * 2
    eagle, _ = model_buffer_layouts(ModelShape.preset("llama-3-70b-eagle"), 8, 2)
    assert [b.buffer_kind for b in eagle[-2:]] == [BufferKind.DRAFT_K, BufferKind.DRAFT_V]


def test_explicit_shapes_and_their_refusals() -> None:
    shape = ModelShape(layers=2, kv_heads=4, head_dim=64, dtype="fp8", page_size=32)
    prefill, _ = model_buffer_layouts(shape, 2, 4)
    assert prefill[0].bytes_per_logical_unit == 32 * 64 * 1
    with pytest.raises(UnsupportedPDLayoutError, match=r"decode side: .*do not split evenly"):
        model_buffer_layouts(shape, 2, 3)
    with pytest.raises(UnsupportedPDLayoutError, match="not a multiple"):
        model_buffer_layouts(shape, 6, 2)
    with pytest.raises(UnsupportedPDLayoutError, match="unknown dtype"):
        model_buffer_layouts(ModelShape(2, 4, 64, dtype="int3"), 2, 2)
    with pytest.raises(UnsupportedPDLayoutError, match="unknown model preset"):
        ModelShape.preset("gpt-5")


def write(tmp_path: Path, config: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_hf_config_reader(tmp_path: Path) -> None:
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "hidden_size": 8192,
        "torch_dtype": "bfloat16",
    }
    assert ModelShape.from_hf_config(write(tmp_path, llama)) == ModelShape.preset("llama-3-70b")
    qwen = {
        "architectures": ["Qwen2ForCausalLM"],
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_size": 3584,
        "head_dim": 128,
        "torch_dtype": "float16",
    }
    shape = ModelShape.from_hf_config(write(tmp_path, qwen), page_size=32)
    assert shape.model_layers == (AttentionLayer(kv_heads=4, head_dim=128),) * 28
    assert shape.page_size == 32
    assert shape.dtype == "float16"  # the dtype the config names, not a size class
    deepseek = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "hidden_size": 7168,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    shape = ModelShape.from_hf_config(write(tmp_path, deepseek))
    assert shape.model_layers == (MlaLayer(kv_lora_rank=512, rope_head_dim=64),) * 61
    mha = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 256,
    }
    (layer, _) = ModelShape.from_hf_config(write(tmp_path, mha)).model_layers
    assert layer == AttentionLayer(kv_heads=4, head_dim=64)
    nested = {"text_config": {**llama, "architectures": None}, "vision_config": {}}
    nested["architectures"] = ["LlamaForCausalLM"]
    assert ModelShape.from_hf_config(write(tmp_path, nested)).num_layers == 80


@pytest.mark.parametrize(
    ("named", "kept"),
    [
        ("float16", "float16"),
        ("bfloat16", "bfloat16"),
        # vLLM's dtype="auto" downcasts float32 (config/model.py _resolve_auto_dtype).
        ("float32", "bfloat16"),
        ("float8_e4m3fn", "float8_e4m3fn"),
        ("float8_e5m2", "float8_e5m2"),
        ("float8_e4m3fnuz", "float8_e4m3fnuz"),
        ("torch.float16", "float16"),
    ],
)
def test_hf_config_keeps_the_dtype_it_names(tmp_path: Path, named: str, kept: str) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "hidden_size": 8,
        "dtype": named,
    }
    shape = ModelShape.from_hf_config(write(tmp_path, config))
    assert shape.dtype == kept
    # And the buffers are sized by it: bf16/fp16 2 bytes, fp32 4, fp8 1.
    prefill, _ = model_buffer_layouts(shape, 1, 1)
    element = {"float32": 4, "float16": 2, "bfloat16": 2}.get(kept, 1)
    assert prefill[0].bytes_per_logical_unit == 16 * 4 * element


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "num_hidden_layers"),
        ({"num_hidden_layers": "80", "num_attention_heads": 8}, "non-negative integer"),
        ({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 100}, "multiple"),
        (
            {
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "hidden_size": 8,
                "torch_dtype": "complex64",
            },
            "unknown dtype",
        ),
        ([1, 2], "object"),
    ],
)
def test_hf_config_refusals(tmp_path: Path, config: object, message: str) -> None:
    if isinstance(config, dict):
        config = {"architectures": ["LlamaForCausalLM"], **config}
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        ModelShape.from_hf_config(write(tmp_path, config))


def test_unreadable_configs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="cannot read"):
        ModelShape.from_hf_config(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(UnsupportedPDLayoutError, match="not valid JSON"):
        ModelShape.from_hf_config(broken)


UNIT = 4096


def item(
    prefill: int, decode: int, logical: int | None = None, kind: BufferKind = BufferKind.TARGET_K
) -> ItemLengths:
    return ItemLengths(0, kind, prefill * UNIT, decode * UNIT, UNIT, 16, logical)


def test_item_lengths_equal_global_units_are_sharded() -> None:
    (p,), (d,) = buffer_layouts_from_item_lengths([item(1, 4)], 8, 2)
    assert (p.logical_axis, p.logical_size, p.item_stride_bytes) == ("kv_head", 8, UNIT)
    assert (d.logical_size, d.item_stride_bytes) == (8, 4 * UNIT)
    (p,), _ = buffer_layouts_from_item_lengths([item(2, 8, kind=BufferKind.MAMBA_STATE)], 8, 2)
    assert p.logical_axis == "state_channel"


def test_item_lengths_equal_items_are_replicated() -> None:
    (p,), (d,) = buffer_layouts_from_item_lengths([item(3, 3)], 4, 2)
    assert p.logical_axis == d.logical_axis == "replicated"


def test_item_lengths_prefill_tp_above_the_heads_gives_replica_groups() -> None:
    (p,), (d,) = buffer_layouts_from_item_lengths([item(1, 2)], 4, 1)
    assert (p.logical_size, p.tp_replica_group_size, d.tp_replica_group_size) == (2, 2, 1)
    # Both sides above the heads: the logical size says how.
    (p,), (d,) = buffer_layouts_from_item_lengths([item(1, 1, logical=2)], 8, 4)
    assert (p.tp_replica_group_size, d.tp_replica_group_size) == (4, 2)


def test_item_lengths_with_token_major_rows() -> None:
    unit = 16 * 128 * 2
    entry = ItemLengths(
        0, BufferKind.TARGET_K, unit, 4 * unit, unit, page_size=16, rows_per_page=16
    )
    (p,), (d,) = buffer_layouts_from_item_lengths([entry], 8, 2)
    assert (p.rows_per_page, d.rows_per_page) == (16, 16)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 8),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=(p,),
        decode_buffers=(d,),
    )
    planner.verify()
    assert planner.transfer_fragments(0)[0][0].rows_per_page == 16
    odd = ItemLengths(0, BufferKind.TARGET_K, unit, 4 * unit, unit, rows_per_page=3)
    with pytest.raises(UnsupportedPDLayoutError, match="rows_per_page=3 must divide"):
        buffer_layouts_from_item_lengths([odd], 8, 2)


@pytest.mark.parametrize(
    ("entry", "tps", "message"),
    [
        (item(1, 3), (4, 2), "neither the same sharded buffer"),
        (ItemLengths(0, BufferKind.TARGET_K, 6000, 4 * UNIT, UNIT), (8, 2), "whole number"),
        (item(1, 1, logical=3), (8, 4), "neither the same sharded buffer"),
        (ItemLengths(0, BufferKind.TARGET_K, UNIT, UNIT, 0), (8, 2), "positive"),
    ],
)
def test_item_length_refusals(entry: ItemLengths, tps: tuple[int, int], message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        buffer_layouts_from_item_lengths([entry], *tps)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ModelShape.preset(123), "preset must be a str, got int"),  # type: ignore[arg-type]
        (
            lambda: ModelShape.preset("llama-3-8b", page_size=0),
            r"page_size=0 must be between 1 and",
        ),
        (lambda: ModelShape.preset("llama-3-8b", page_size=-1), "page_size"),
        (
            lambda: model_buffer_layouts(ModelShape(2, 4, 64, dtype=5), 2, 2),  # type: ignore[arg-type]
            "dtype must be a string",
        ),
        (lambda: model_buffer_layouts(ModelShape(2, 4, 64), 0, 2), "tp_size=0 must be between 1"),
        (lambda: model_buffer_layouts(ModelShape(2, 4, 64), True, 2), "prefill_tp"),
        (lambda: model_buffer_layouts("llama", 2, 2), "field, got str"),  # type: ignore[arg-type]
        (lambda: model_buffer_layouts(ModelShape(2**40, 4, 64), 2, 2), "MAX_LAYERS"),
        (
            lambda: model_buffer_layouts(
                ModelShape(2, 4, 64, mla_kv_lora_rank=2**62, mla_rope_head_dim=2**62), 2, 2
            ),
            "overflow",
        ),
        (lambda: model_buffer_layouts(ModelShape(2, 4, 64), 2**40, 2), "MAX_WORLD_SIZE"),
        (lambda: buffer_layouts_from_item_lengths([item(1, 1)], 2**62, 2), "between 1 and"),
    ],
)
def test_bad_arguments_are_layout_errors(call: object, message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(("name", "prefill_tp", "decode_tp"), preset_tps([(2, 4)]))
@pytest.mark.parametrize(("prefill_pp", "decode_pp"), [(2, 1), (1, 2), (2, 4)])
def test_every_preset_plans_with_pipeline_stages(
    name: str, prefill_tp: int, decode_tp: int, prefill_pp: int, decode_pp: int
) -> None:
    shape = ModelShape.preset(name)
    prefill, decode = model_buffer_layouts(
        shape, prefill_tp, decode_tp, prefill_pp=prefill_pp, decode_pp=decode_pp
    )
    # Every buffer names its layer; the layers named are exactly those with a cache.
    without = ("mlp", "shared_kv")  # MLP-only layers, and attention reading another's KV
    with_cache = {i for i, layer in enumerate(shape.model_layers) if layer.kind not in without}
    assert {b.layer for b in prefill} == with_cache
    if shape.draft_layers:  # draft buffers sit on the last layer, so the last stage
        assert prefill[-1].layer == shape.num_layers - 1

    def layout(role: Literal["prefill", "decode"], tp: int, pp: int) -> ParallelLayout:
        # Stages split the model's layers, MLP-only ones too (vLLM's default split).
        partition = vllm_layer_partition(shape.num_layers, pp) if pp > 1 else None
        return ParallelLayout(role, tp * pp, pp_size=pp, pp_layer_partition=partition)

    planner = PDTransferPlanner(
        prefill_layout=layout("prefill", prefill_tp, prefill_pp),
        decode_layout=layout("decode", decode_tp, decode_pp),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    planner.verify()
    # Without stages the layers are ignored: the same plans as buffers that name none.
    plain, plain_decode = model_buffer_layouts(shape, prefill_tp, decode_tp)
    unnamed = [tuple(replace(b, layer=None) for b in side) for side in (plain, plain_decode)]
    plans = [
        PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", prefill_tp),
            decode_layout=ParallelLayout("decode", decode_tp),
            prefill_buffers=p,
            decode_buffers=d,
        ).plan_for_decode_rank(decode_tp - 1)
        for p, d in ((plain, plain_decode), unnamed)
    ]
    assert plans[0] == plans[1]


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(2, 1), (1, 2), (1, 4), (4, 2)])
def test_one_group_mamba2_above_tp_one_copies_b_and_c_onto_every_rank(
    prefill_tp: int, decode_tp: int
) -> None:
    """Falcon-H1-7B keeps one B/C group: vLLM's ``mamba2_state_shape`` extends n_groups by
    ``extra_groups_for_head_shards`` (1 -> TP), so a rank's conv state holds its share of x
    and a whole copy of B and C: ``(d_ssm + 2 * TP * d_state) / TP`` channels of 3 taps. Each
    side's items hold that, and every decode rank's copy is written (the brute-force check)."""
    d_ssm, d_state, taps, bf16 = 3072, 256, 3, 2
    prefill, decode = model_buffer_layouts(ModelShape.preset("falcon-h1-7b"), prefill_tp, decode_tp)
    for tp, buffers in ((prefill_tp, prefill), (decode_tp, decode)):
        conv = next(b for b in buffers if b.logical_parts)
        assert conv.item_stride_bytes == (d_ssm + 2 * tp * d_state) // tp * taps * bf16
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", prefill_tp),
        decode_layout=ParallelLayout("decode", decode_tp),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    planner.verify()
    # B and C come from one prefill rank each: decode rank 0 reads x from the ranks holding
    # its share and nothing more.
    assert planner.plan_for_decode_rank(0).target_prefill_ranks == tuple(
        range(max(1, prefill_tp // decode_tp))
    )


@pytest.mark.parametrize(
    ("pp", "message"),
    [
        (0, r"prefill_pp=0 must be between 1 and"),
        (-1, r"prefill_pp must be an integer in \[0, 2\^63\), got -1 \(int\)"),
        (True, r"prefill_pp must be an integer .* \(bool\)"),
        (1.5, r"prefill_pp must be an integer .* \(float\)"),
    ],
)
def test_pipeline_stage_counts_must_be_positive_integers(pp: object, message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        model_buffer_layouts(ModelShape.preset("llama-3-8b"), 2, 2, prefill_pp=pp)  # type: ignore[arg-type]


#: Layer counts of the presets' published configs (``num_hidden_layers``).
PUBLISHED_LAYERS = {
    "llama-3-8b": 32,
    "llama-3-70b": 80,
    "qwen2.5-32b": 64,
    "deepseek-v3": 61,
    "gpt-oss-120b": 36,
    "gemma-3-27b": 62,
}
UNIFORM_FIELDS = {"layers", "kv_heads", "head_dim", "mla_kv_lora_rank", "mla_rope_head_dim"}


@pytest.mark.parametrize(("name", "layers"), PUBLISHED_LAYERS.items())
def test_a_presets_json_and_repr_say_its_layer_count(name: str, layers: int) -> None:
    shape = ModelShape.preset(name)
    written = json.loads(shape.to_json())
    assert written["num_layers"] == layers == len(written["layer_kinds"])
    # A preset is its layer_kinds: the uniform shorthand's fields (all 0) are not written.
    assert not UNIFORM_FIELDS & written.keys()
    assert repr(shape).startswith(f"ModelShape({layers} layers: ")


def test_llama_3_70b_as_json() -> None:
    # config.json: 80 layers, 8 KV heads, head dim 8192 / 64 = 128, bfloat16.
    written = json.loads(ModelShape.preset("llama-3-70b").to_json())
    layer = {"kind": "attention", "kv_heads": 8, "head_dim": 128}
    layer |= {"sliding_window": None, "v_head_dim": None, "attention_chunk_size": None}
    layer |= {"index_head_dim": 0}
    assert written["layer_kinds"] == [layer] * 80
    assert written["dtype"] == "bfloat16" and written["draft_layers"] == 0


def test_the_uniform_shorthand_is_written_as_its_layers() -> None:
    shape = ModelShape(layers=3, kv_heads=4, head_dim=64, page_size=8)
    written = json.loads(shape.to_json())
    assert written["num_layers"] == 3 and not UNIFORM_FIELDS & written.keys()
    kinds = written["layer_kinds"]
    made = [(k.pop("kind"), k["kv_heads"], k["head_dim"]) for k in kinds]
    assert made == [("attention", 4, 64)] * 3
    # Read back as layer_kinds, it is the same model.
    again = ModelShape(layer_kinds=tuple(AttentionLayer(**k) for k in kinds), page_size=8)
    assert model_buffer_layouts(again, 2, 4) == model_buffer_layouts(shape, 2, 4)


@pytest.mark.parametrize("name", MODEL_PRESETS)
def test_a_presets_repr_is_one_short_line(name: str) -> None:
    text = repr(ModelShape.preset(name))
    assert len(text) <= 200 and "\n" not in text, text


def test_the_repr_names_kinds_draft_and_dtypes() -> None:
    # EAGLE's Llama-3-70B head: one decoder layer of 8 KV heads x 128 on the 80-layer model.
    assert repr(ModelShape.preset("llama-3-70b-eagle")) == (
        "ModelShape(80 layers: 80 full attention, 1 draft layer (8 KV heads x 128); "
        "bfloat16, page_size=16, family='llama')"
    )
    hybrid = replace(ModelShape.preset("jamba-1.5-mini"), kv_cache_dtype="fp8")
    # Jamba: one attention layer in eight, 32 layers.
    assert repr(hybrid) == (
        "ModelShape(32 layers: 28 Mamba1, 4 full attention; bfloat16, kv_cache_dtype='fp8', "
        "page_size=16, family='jamba')"
    )
    # A shape the core refuses still shows what it was given.
    assert repr(ModelShape(layers=-1, kv_heads=8)) == "ModelShape(layers=-1, kv_heads=8)"
