"""The Python layer classes are the core's layer-kind schema (src/model/layer_kinds.rs): the
same kinds, classes, fields in order and defaults, and every one public."""

from __future__ import annotations

import dataclasses
import typing

import pytest

import pdplan
from pdplan import _core, _layouts

SCHEMA = _core.LAYER_KINDS


def test_every_kind_is_a_public_class() -> None:
    classes = [cls for _, cls, _, _ in SCHEMA]
    assert len(set(classes)) == len(classes)
    assert set(classes) <= set(_layouts.__all__) and set(classes) <= set(pdplan.__all__)
    union = {cls.__name__ for cls in typing.get_args(_layouts.ModelLayer)}
    assert union == set(classes)


@pytest.mark.parametrize(("kind", "cls", "keeps", "fields"), SCHEMA, ids=[r[0] for r in SCHEMA])
def test_a_class_is_its_schema_row(
    kind: str, cls: str, keeps: str, fields: list[tuple[str, str, int | None, str]]
) -> None:
    layer_class = getattr(_layouts, cls)
    assert layer_class.kind == kind and keeps
    own = dataclasses.fields(layer_class)
    assert [f.name for f in own] == [name for name, _, _, _ in fields]
    hints = typing.get_type_hints(layer_class)
    for f, (name, ty, default, doc) in zip(own, fields):
        assert doc, name
        if ty == "int":
            assert hints[name] is int, name
            expected = dataclasses.MISSING if default is None else default
            assert f.default == expected, name
        elif ty == "int | None":
            assert hints[name] == int | None and f.default is None, name
        else:
            part = next(c for k, c, _, _ in SCHEMA if k == ty)
            assert hints[name] is getattr(_layouts, part), name
            assert f.default is dataclasses.MISSING, name


def test_every_kind_survives_the_core_both_ways() -> None:
    """One layer of every kind, each field its own value, read by the core and built back."""
    values = iter(range(2, 1000))

    def sample(cls: str) -> object:
        row = next(r for r in SCHEMA if r[1] == cls)
        kwargs: dict[str, object] = {}
        for name, ty, _, _ in row[3]:
            if name == "attention_chunk_size":
                kwargs[name] = None  # a window or a chunk, not both
            elif ty in ("int", "int | None"):
                kwargs[name] = 16 * next(values)
            else:
                kwargs[name] = sample(next(c for k, c, _, _ in SCHEMA if k == ty))
        return getattr(_layouts, cls)(**kwargs)

    layers = tuple(sample(cls) for _, cls, _, _ in SCHEMA)
    shape = pdplan.ModelShape(layer_kinds=layers)  # type: ignore[arg-type]
    assert _core.model_layers(shape) == layers


def test_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    @dataclasses.dataclass(frozen=True)
    class Rwkv:
        kind: typing.ClassVar[str] = "rwkv"

    shape = pdplan.ModelShape(layer_kinds=(Rwkv(),))  # type: ignore[arg-type]
    with pytest.raises(pdplan.UnsupportedPDLayoutError, match="attention, mla, mamba2"):
        _core.model_layers(shape)


def field_docstrings(cls: str) -> dict[str, str]:
    """The docstrings written under each field of a layer class, as the API reference reads
    them (griffe, statically)."""
    import griffe

    loaded = griffe.load("pdplan._layouts", docstring_parser="sphinx", allow_inspection=False)
    members = loaded[cls].members
    return {
        name: member.docstring.value
        for name, member in members.items()
        if isinstance(member, griffe.Attribute) and member.docstring is not None
    }


@pytest.mark.parametrize(("kind", "cls", "keeps", "fields"), SCHEMA, ids=[r[0] for r in SCHEMA])
def test_a_field_s_docstring_says_what_its_schema_row_says(
    kind: str, cls: str, keeps: str, fields: list[tuple[str, str, int | None, str]]
) -> None:
    """The reference's field descriptions are written by hand beside the fields: each begins
    with the schema's own words for it, so the two cannot drift apart."""
    docs = field_docstrings(cls)
    for name, _, _, doc in fields:
        assert name in docs, f"{cls}.{name} has no docstring"
        assert docs[name].lower().startswith(doc.lower().rstrip(".")), (cls, name, docs[name], doc)


@pytest.mark.parametrize(("index_head_dim", "row_bytes"), [(64, 64), (128, 132), (256, 264)])
def test_an_indexer_keeps_a_scale_per_128_keys(index_head_dim: int, row_bytes: int) -> None:
    # vLLM models/deepseek_v32/attention.py: the indexer's key cache is head_dim +
    # head_dim // 128 * 4 bytes a token (fp8 keys, a 4-byte ue8m0 scale per 128 of them).
    layer = pdplan.MlaLayer(kv_lora_rank=512, rope_head_dim=64, index_head_dim=index_head_dim)
    shape = pdplan.ModelShape(dtype="bfloat16", page_size=16, layer_kinds=(layer,))
    prefill, _ = pdplan.model_buffer_layouts(shape, 1, 1)
    latent, indexer = prefill
    assert latent.item_stride_bytes == (512 + 64) * 2 * 16
    assert indexer.item_stride_bytes == row_bytes * 16


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(4, 1), (1, 4), (4, 2), (8, 8)])
def test_index_keys_are_one_head_on_every_rank(prefill_tp: int, decode_tp: int) -> None:
    # MiniMax-M3's sparse layers: K and V of 4 heads split over TP, and one bf16 index key of
    # 128 a token that every rank holds whole (vLLM MiniMaxM3IndexerCache, one head). A decode
    # rank receives its K and V heads and the whole index key, once.
    sparse = pdplan.AttentionLayer(kv_heads=4, head_dim=128, index_head_dim=128)
    shape = pdplan.ModelShape(page_size=16, layer_kinds=(sparse,))
    _, decode = pdplan.model_buffer_layouts(shape, prefill_tp, decode_tp)
    assert [b.item_stride_bytes for b in decode][2] == 128 * 2 * 16
    assert [b.is_token_indexed for b in decode] == [True] * 3
    pairing = pdplan.Pairing(
        shape,
        pdplan.ParallelLayout("prefill", prefill_tp),
        pdplan.ParallelLayout("decode", decode_tp),
    )
    pairing.planner.verify()
    cost = pairing.cost(160)
    heads = max(4 // decode_tp, 1)
    kv_bytes, index_bytes = 160 * 2 * heads * 128 * 2, 160 * 128 * 2
    # K and V go to the first rank of each replica group ("first"); every rank needs the
    # index keys, as every rank needs a replicated MLA latent.
    receiving = min(decode_tp, 4)
    assert cost.bytes == receiving * kv_bytes + decode_tp * index_bytes
