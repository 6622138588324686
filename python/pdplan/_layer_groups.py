"""Layer groups for streaming a request while prefill runs, chosen by the cost model in the
Rust core (``layer_groups.rs``): consecutive layers grouped so that the last byte lands
earliest, each group paying a fixed ``per_transfer_s`` beside the wire's roofline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdplan import _core
from pdplan._bounded import shown
from pdplan._core import UnsupportedPDLayoutError
from pdplan._staging import CostModel

__all__ = [
    "DEFAULT_LAYER_SECONDS_PER_TOKEN",
    "DEFAULT_PER_TRANSFER_S",
    "LayerGroups",
    "layer_groups",
]

#: Seconds a transfer costs however small: posting it and its completion notice reaching the
#: other side (a NIXL or Mooncake round trip on one host is tens of microseconds; measured
#: here by ``benches/streaming.py``).
DEFAULT_PER_TRANSFER_S = 20e-6
#: Seconds one layer of prefill takes a token, where the runtime reports none: a 70B-class
#: layer (about 0.86 G parameters, 2 FLOPs each a token) at 700 TFLOP/s, an H100's dense bf16.
DEFAULT_LAYER_SECONDS_PER_TOKEN = 2.5e-6


@dataclass(frozen=True)
class LayerGroups:
    """Consecutive layer groups to stream a request in, and what the cost model expects."""

    groups: tuple[range, ...]
    """The groups, in order, covering every layer: pass each as ``layers=`` to a slice."""
    tail_s: float
    """Seconds from prefill's last layer to the last byte landed, streamed in these groups."""
    whole_tail_s: float
    """The same for the whole request moved once prefill ends."""


def layer_groups(
    loads: Sequence[tuple[int, int]],
    *,
    layer_seconds: float,
    cost_model: CostModel | None = None,
    per_transfer_s: float = DEFAULT_PER_TRANSFER_S,
) -> LayerGroups:
    """The layer groups whose last byte lands earliest: prefill finishes a layer every
    ``layer_seconds``, a group moves once its last layer is done, one group at a time, each
    costing ``per_transfer_s`` plus the cost model's wire time. Short requests come out as one
    group (the fixed cost outweighs their bytes), long ones stream.

    :param loads: One ``(descriptors, bytes)`` a layer, in order, of the busiest rank pair.
    :param layer_seconds: Seconds prefill takes a layer for this request (the runtime's
        figure, or ``tokens * DEFAULT_LAYER_SECONDS_PER_TOKEN``).
    :param cost_model: The engine's figures; None: ``CostModel()``.
    :param per_transfer_s: Seconds a transfer costs however small.
    """
    model = cost_model or CostModel()
    if not isinstance(model, CostModel):
        raise UnsupportedPDLayoutError(
            f"cost_model must be a CostModel, got {type(model).__name__}"
        )
    if isinstance(loads, (str, bytes)) or not isinstance(loads, Sequence):
        raise UnsupportedPDLayoutError(
            f"loads must be a sequence of (descriptors, bytes) pairs, got {type(loads).__name__}"
        )
    rows = []
    for row in loads:
        if (
            not isinstance(row, tuple)
            or len(row) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in row)
        ):
            raise UnsupportedPDLayoutError(
                f"loads holds one (descriptors, bytes) pair of ints a layer, got {shown(row)}"
            )
        rows.append(row)
    for name, value in (("layer_seconds", layer_seconds), ("per_transfer_s", per_transfer_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UnsupportedPDLayoutError(f"{name} must be a number, got {shown(value)}")
    groups, tail, whole = _core.layer_groups(
        rows, float(layer_seconds), float(per_transfer_s), model._figures()
    )
    return LayerGroups(tuple(range(a, b) for a, b in groups), tail, whole)
