"""Stub of the compiled core (src/python/)."""

from collections.abc import Iterable
from typing import final

import numpy as np
import numpy.typing as npt

from pdplan._layouts import ItemLengths, ModelShape
from pdplan._model import (
    BufferLayout,
    ParallelLayout,
    RankTransferPlan,
    TransferFragment,
)

__all__ = [
    "DEFAULT_MAX_FRAGMENTS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_DESCRIPTORS",
    "MAX_WORLD_SIZE",
    "MODEL_PRESETS",
    "RANK_TRANSFER_PLAN_FIELDS",
    "TRANSFER_FRAGMENT_FIELDS",
    "TRANSFER_PLAN_PROTOCOL_VERSION",
    "TRANSFER_PLAN_READABLE_VERSIONS",
    "Planner",
    "UnsupportedPDLayoutError",
    "__version__",
    "buffers_from_item_lengths",
    "check_buffer_layout",
    "check_parallel_layout",
    "check_transfer_fragment",
    "decode_transfer_fragments",
    "dtype_bytes",
    "encode_transfer_fragments",
    "model_buffers",
    "model_shape_fields",
    "transfer_descriptors",
]

__version__: str
MODEL_PRESETS: list[str]
MAX_DESCRIPTORS: int
DEFAULT_MAX_PAYLOAD_BYTES: int
DEFAULT_MAX_FRAGMENTS: int
TRANSFER_PLAN_PROTOCOL_VERSION: int
TRANSFER_PLAN_READABLE_VERSIONS: tuple[int, ...]
MAX_WORLD_SIZE: int
TRANSFER_FRAGMENT_FIELDS: list[str]
RANK_TRANSFER_PLAN_FIELDS: list[str]

class UnsupportedPDLayoutError(ValueError):
    """A layout, plan, frame or request pdplan cannot serve; the message says what to change."""

def check_parallel_layout(layout: ParallelLayout) -> None: ...
def check_buffer_layout(buffer: BufferLayout) -> None: ...
def check_transfer_fragment(fragment_obj: TransferFragment) -> None: ...
def encode_transfer_fragments(fragments: Iterable[TransferFragment]) -> tuple[bytes, bytes]: ...
def decode_transfer_fragments(
    version_frame: bytes | None,
    payload_frame: bytes | None,
    *,
    max_payload_bytes: int | None = None,
    max_fragments: int | None = None,
) -> tuple[TransferFragment, ...]: ...
def transfer_descriptors(
    fragments: Iterable[TransferFragment],
    src_base_ptrs: npt.ArrayLike,
    dst_base_ptrs: npt.ArrayLike,
    src_pages: npt.ArrayLike,
    dst_pages: npt.ArrayLike,
    *,
    coalesce: bool = True,
    src_limits: npt.ArrayLike | None = None,
    dst_limits: npt.ArrayLike | None = None,
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]: ...

_BufferRow = tuple[int, str, str, int, int, int, int, int, int, list[int] | None]

def model_buffers(
    shape: ModelShape, prefill_tp: int, decode_tp: int, kv_layout: str | None = None
) -> tuple[list[_BufferRow], list[_BufferRow]]: ...
def buffers_from_item_lengths(
    items: Iterable[ItemLengths], prefill_tp: int, decode_tp: int
) -> tuple[list[_BufferRow], list[_BufferRow]]: ...
def model_shape_fields(
    config_text: str | None = None, preset: str | None = None, page_size: int | None = None
) -> tuple[str, list[tuple[str, int]]]: ...
def dtype_bytes(name: str) -> int: ...

@final
class Planner:
    def __new__(
        cls,
        prefill_layout: ParallelLayout,
        decode_layout: ParallelLayout,
        prefill_buffers: Iterable[BufferLayout],
        decode_buffers: Iterable[BufferLayout],
        decode_replicas: str | None = None,
    ) -> Planner: ...
    def plan_for_decode_rank(
        self, decode_rank: int, prefill_dp_group: int | None = None
    ) -> RankTransferPlan: ...
    def source_fanout(self) -> dict[int, int]: ...
    def verify(self) -> None: ...
    def transfer_fragments(
        self, decode_rank: int, prefill_dp_group: int | None = None
    ) -> dict[int, tuple[TransferFragment, ...]]: ...
    def routing_table(
        self,
    ) -> tuple[
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
    ]: ...
    @property
    def is_identity(self) -> bool: ...
    @property
    def idle_decode_ranks(self) -> int: ...
