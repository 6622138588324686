"""State tensors (Mamba, GDN, ...) as buffers, the same on every runtime: the one axis whose
extent is the rank's share of the channels is the split axis; axes before it are rows, after
it inner dims."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdplan._arrays import StateSpec, buffer_from_array
from pdplan._bounded import shown
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout


def attribute(obj: Any, name: str, what: str) -> Any:
    """A runtime object's attribute, or a clear refusal naming what is missing."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise UnsupportedPDLayoutError(
            f"{what} ({type(obj).__name__}) has no {shown(name)}; pass the runtime's own object"
        ) from None


def shape_of(array: Any, what: str) -> tuple[int, ...]:
    """An array's shape as ints, or a clear refusal for what is not an array."""
    shape = attribute(array, "shape", what)
    try:
        return tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise UnsupportedPDLayoutError(f"{what} has a shape that is not a tuple of ints") from None


def state_buffer(
    buffer_index: int, array: Any, spec: StateSpec, tp_size: int, layer: int | None = None
) -> tuple[BufferLayout, int, int]:
    """One state tensor of one layer, ``(request slots, ...)``, as a buffer."""
    shape = shape_of(array, f"state tensor {buffer_index}")
    # The channel axis is right after the slot axis or one row axis (a conv state's taps):
    # the first the core reads as holding this rank's channels (its share of each part).
    refusals = []
    for channel in range(1, min(3, len(shape))):
        inner = ["dim"] * (len(shape) - 1 - channel)
        axes = ["page", *["row"] * (channel - 1), "channel", *inner]
        try:
            return buffer_from_array(
                buffer_index,
                BufferKind.MAMBA_STATE,
                array,
                axes,
                logical_size=spec.logical_size,
                tp_size=tp_size,
                logical_parts=spec.logical_parts,
                logical_part_groups=spec.part_groups,
                layer=layer,
            )
        except UnsupportedPDLayoutError as error:
            refusals.append(str(error))
    raise UnsupportedPDLayoutError(
        f"state tensor {buffer_index} of shape {shape}: no axis right after the slot axis or "
        f"one row axis holds this rank's share of {spec.logical_size} channels (TP {tp_size}); "
        f"check the state spec and tp_size ({refusals[0] if refusals else 'no such axis'})"
        + _copied_parts(shape, spec, tp_size)
    )


def _copied_parts(shape: tuple[int, ...], spec: StateSpec, tp_size: int) -> str:
    """Why a rank holds more than its share of a state with parts: the runtime copied some
    parts onto every rank (Mamba2's B and C groups below n_groups ranks)."""
    share = spec.logical_size // max(tp_size, 1)
    if (
        not spec.logical_parts
        or spec.part_groups
        or not any(share < n < spec.logical_size for n in shape[1:3])
    ):
        return ""
    return (
        "; a rank holding more than its share of the parts is a state whose parts are copied "
        "to every rank (Mamba2's B and C when n_groups is below TP): give the spec each "
        "part's groups (StateSpec.part_groups; pdplan.state_specs gives Mamba2's)"
    )


#: The state specs of recurrent layers: the same for every layer, or each layer's by its model
#: layer (a model mixing two kinds of recurrent layer).
StateSpecs = Sequence[StateSpec] | Mapping[int, Sequence[StateSpec]]


def _specs_of(states: StateSpecs, layer: int | None, position: int) -> Sequence[StateSpec]:
    if not isinstance(states, Mapping):
        return states
    if layer is None or layer not in states:
        raise UnsupportedPDLayoutError(
            f"states= names no specs for recurrent layer {position} (model layer {layer}); "
            "give every recurrent layer's"
        )
    return states[layer]


def state_buffers(
    first_index: int,
    layers: Sequence[Sequence[Any]],
    states: StateSpecs | None,
    tp_size: int,
    layer_ids: Sequence[int] | None = None,
) -> list[tuple[BufferLayout, int, int]]:
    """Every state tensor of every recurrent layer, layer by layer, numbered from
    ``first_index``; ``layer_ids`` is each layer's model layer (its ``BufferLayout.layer``)."""
    if not layers:
        return []
    if not states:
        raise UnsupportedPDLayoutError(
            f"the cache holds {len(layers)} recurrent layers; pass states= (one StateSpec per "
            "state tensor of a layer, e.g. pdplan.runtimes.state_specs(layer))"
        )
    built: list[tuple[BufferLayout, int, int]] = []
    for position, tensors in enumerate(layers):
        layer = None if layer_ids is None else layer_ids[position]
        specs = _specs_of(states, layer, position)
        if len(tensors) != len(specs):
            raise UnsupportedPDLayoutError(
                f"recurrent layer {position} holds {len(tensors)} state tensors, but states= "
                f"describes {len(specs)}"
            )
        for tensor, spec in zip(tensors, specs):
            built.append(state_buffer(first_index + len(built), tensor, spec, tp_size, layer))
    return built
