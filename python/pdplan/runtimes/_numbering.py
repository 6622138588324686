"""How a vLLM model numbers the layers in its cache names (the keys of ``kv_caches``).

Most models name layer ``i``'s cache ``model.layers.{i}...``; some number a layer's parts
otherwise, because vLLM requires every attention and state layer to have its own index in its
name. A model that does is one entry of ``NUMBERINGS``: a function of its config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pdplan._bounded import shown
from pdplan._core import UnsupportedPDLayoutError

#: What vLLM names a layer by: the one integer among the dotted parts of its name
#: (``model.layers.7.self_attn.attn``), as ``extract_layer_index`` in vLLM's
#: ``model_executor/models/utils.py`` reads it.
_INDEX_PARTS = "exactly one integer among the dotted parts of the name"

#: The dotted part naming a Mamba mixer's state (``model.7.mixer``).
_MIXER = "mixer"


def layer_index(name: str) -> int:
    """The model layer a vLLM layer name (a key of ``kv_caches``) names: its one integer part,
    as vLLM's ``extract_layer_index`` reads it (``model.layers.7.self_attn.attn``: 7;
    ``language_model.model.layers.7.mixer``: 7). A name with no integer part, or with more
    than one, is refused naming it.

    :param name: The layer's name, as vLLM keys it in ``kv_caches``.
    """
    numbers = [int(part) for part in str(name).split(".") if part.isdigit()]
    if len(numbers) != 1:
        raise UnsupportedPDLayoutError(
            f"kv_caches key {shown(name)} names no layer pdplan can read: a vLLM layer name "
            f"holds {_INDEX_PARTS} (model.layers.7.self_attn.attn); pass the dict vLLM's "
            "model runner keeps, or a list in model order"
        )
    return numbers[0]


@dataclasses.dataclass(frozen=True)
class LayerNumbering:
    """How one vLLM model numbers the layers in its cache names: ``numbering(name)`` is the
    model layer a ``kv_caches`` key names. A name numbered past the model's layers (a draft
    model's MTP or EAGLE layer) is refused naming it: its cache is no layer of the model's
    config.

    :param num_layers: The model's layers (``num_hidden_layers``); None: names are not checked.
    :param mixers_from: A mixer named ``mixers_from + i`` (``model.{n}.mixer``) is layer
        ``i``'s state (Falcon-H1, Zamba2); 0: its number is its layer.
    :param attention_layers: The model layer of the attention named ``j``, where a model
        numbers its attention layers among themselves (Zamba2); None: its number is its layer.
    """

    num_layers: int | None = None
    mixers_from: int = 0
    attention_layers: tuple[int, ...] | None = None

    @classmethod
    def of(cls, config: Any, architecture: str | None = None) -> LayerNumbering:
        """The numbering of the model of ``config`` (a Hugging Face text config object or its
        ``config.json`` as a mapping): by its architecture (``architecture``, else the
        config's first) in ``NUMBERINGS``, else each name's number is its layer, checked
        against ``num_hidden_layers``."""
        if architecture is None:
            architecture = (_read(config, "architectures") or [None])[0]
        layers = _read(config, "num_hidden_layers")
        numbered = cls(layers if isinstance(layers, int) else None)
        special = NUMBERINGS.get(str(architecture))
        return special(config, numbered) if special is not None else numbered

    def __call__(self, name: str) -> int:
        number = layer_index(name)
        mixer = _MIXER in str(name).split(".")
        if mixer:
            layer = number - self.mixers_from
        elif self.attention_layers is not None:
            attention = self.attention_layers
            layer = attention[number] if number < len(attention) else -1
        else:
            layer = number
        if self.num_layers is None or 0 <= layer < self.num_layers:
            return layer
        raise UnsupportedPDLayoutError(
            f"kv_caches key {shown(name)} is numbered {number} ({self._read_as()}), past the "
            f"model's {self.num_layers} layers: a draft model's layer (MTP, EAGLE) or a "
            "numbering pdplan does not read; serve without speculative decoding, or ask for "
            "this model's numbering"
        )

    def _read_as(self) -> str:
        parts = [f"a mixer numbered n is layer n - {self.mixers_from}"] if self.mixers_from else []
        if self.attention_layers is not None:
            parts.append(f"attention j is layer {list(self.attention_layers)}[j]")
        return "; ".join(parts) or "its number is its layer"


def _read(config: Any, key: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def _falcon_h1(config: Any, numbered: LayerNumbering) -> LayerNumbering:
    """vLLM's ``falcon_h1.py`` (``FalconH1ParallelHybrid``) names layer ``i``'s attention
    ``model.layers.{i}.self_attn.attn`` and its Mamba mixer ``model.{num_hidden_layers +
    i}.mixer`` ("In V1 all attention/ssm layers must have different index in prefix")."""
    return dataclasses.replace(numbered, mixers_from=numbered.num_layers or 0)


def _zamba2(config: Any, numbered: LayerNumbering) -> LayerNumbering:
    """vLLM's ``zamba2.py``: layer ``i``'s mixer is ``{H + i}.mixer`` (``H`` hybrid layers,
    each ``Zamba2HybridLayer`` prefixed ``str(len(layer2block_map) + layer_idx)``); the
    ``k``-th hybrid layer runs the shared block ``b = k % num_mem_blocks``, whose attention
    for it is ``model.attn.{j}``, ``j`` counting from ``b * (H + M - 1) // M`` over the hybrid
    layers of that block (``Zamba2Attention.dpa_list``)."""
    kinds = _read(config, "layers_block_type")
    blocks = _read(config, "num_mem_blocks")
    if not isinstance(kinds, Sequence) or not isinstance(blocks, int) or blocks < 1:
        raise UnsupportedPDLayoutError(
            "a Zamba2 config names its cache layers by layers_block_type and num_mem_blocks "
            f"(a list and a positive integer), got {shown(kinds)} and {shown(blocks)}"
        )
    hybrid = [layer for layer, kind in enumerate(kinds) if kind == "hybrid"]
    count = len(hybrid)
    attention: dict[int, int] = {}
    for block in range(blocks):
        j = block * (count + blocks - 1) // blocks
        for k in range(block, count, blocks):
            attention[j] = hybrid[k]
            j += 1
    if sorted(attention) != list(range(count)):
        raise UnsupportedPDLayoutError(
            f"a Zamba2 config of {count} hybrid layers over {blocks} shared blocks numbers its "
            f"attention layers {sorted(attention)}, not once each from 0: vLLM would give two "
            "layers one name"
        )
    return dataclasses.replace(
        numbered, mixers_from=count, attention_layers=tuple(attention[j] for j in range(count))
    )


#: Models whose cache names number a layer's parts otherwise than by the layer, by
#: architecture: each a function of the model's config and its plain numbering. Found by
#: reading every model of vLLM 0.32's registry whose layer prefixes are not
#: ``{prefix}.layers.{i}`` (``rg 'prefix=f?"?\{?(str\(|len)'``).
NUMBERINGS: Mapping[str, Callable[[Any, LayerNumbering], LayerNumbering]] = {
    "FalconH1ForCausalLM": _falcon_h1,
    "Zamba2ForCausalLM": _zamba2,
}
