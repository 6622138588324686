"""What a runtime's planner needs besides its buffers: which decode ranks of a replica group
read (the runtime's rule, not the reference's), and how the scheduler's block ids name the
cache's pages. One object a runtime, so a runtime adopting pdplan gets neither wrong."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pdplan._bounded import int_ids
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferLayout, ParallelLayout
from pdplan._planner import PDTransferPlanner

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


@dataclass(frozen=True)
class RuntimeConventions:
    """A runtime's rules for planning its caches.

    ``decode_replicas`` is the runtime's replica rule: with decode TP above the KV-head count,
    vLLM's NixlConnector and SGLang's transfer have every decode rank read its own heads
    (``"all"``), where the reference planner serves only each replica group's first rank.
    ``block_size`` is the scheduler's block (tokens); ``kernel_block_size`` the cache tensor's
    page, smaller when vLLM splits each block into ``kernel_blocks_per_block`` kernel blocks
    (``block_size / kernel_block_size``), kept one after another: block ``b`` is kernel pages
    ``b * r .. b * r + r - 1``."""

    runtime: str
    """The runtime's name: ``"vllm"`` or ``"sglang"``."""
    decode_replicas: Literal["first", "all"]
    """Which decode ranks of a replica group receive (``PDTransferPlanner``'s argument)."""
    block_size: int
    """Tokens of one block as the scheduler counts them (its block ids name these)."""
    kernel_block_size: int
    """Tokens of one page of the cache tensors (what ``buffers`` describes)."""

    def __post_init__(self) -> None:
        for name in ("block_size", "kernel_block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UnsupportedPDLayoutError(f"{name} must be an int, got {type(value).__name__}")
        if self.block_size <= 0 or self.kernel_block_size <= 0:
            raise UnsupportedPDLayoutError(
                f"block sizes must be positive, got block_size={self.block_size}, "
                f"kernel_block_size={self.kernel_block_size}"
            )
        if self.block_size % self.kernel_block_size:
            raise UnsupportedPDLayoutError(
                f"kernel_block_size={self.kernel_block_size} does not divide "
                f"block_size={self.block_size}: vLLM splits a block into whole kernel blocks"
            )

    @property
    def kernel_blocks_per_block(self) -> int:
        """Kernel blocks (cache pages) in one scheduler block."""
        return self.block_size // self.kernel_block_size

    def pages(self, block_ids: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
        """The cache pages of the scheduler's blocks ``block_ids``, in order: what
        ``PreparedTransfer.descriptors`` takes as a side's pages. Both sides' lists pair page
        by page, so the two sides' kernel block sizes must be equal (else move tokens by slot
        maps: ``slots`` is the same either way).

        :param block_ids: The request's block ids as the scheduler gives them.
        """
        import numpy as np

        ids = int_ids(block_ids, "block_ids")
        if ids.size and ids.min() < 0:
            raise UnsupportedPDLayoutError("block_ids must not be negative")
        ratio = self.kernel_blocks_per_block
        return (ids[:, None] * ratio + np.arange(ratio, dtype=np.int64)).reshape(-1)

    def slots(
        self, block_ids: Sequence[int] | npt.NDArray[np.integer], num_tokens: int
    ) -> npt.NDArray[np.int64]:
        """The slot map of a request of ``num_tokens`` tokens in blocks ``block_ids``
        (``block * block_size + offset``): the same slots whether pages are blocks or kernel
        blocks, for ``PreparedTransfer.token_descriptors``.

        :param block_ids: The request's block ids as the scheduler gives them.
        :param num_tokens: The request's tokens.
        """
        from pdplan._context import token_slots

        return token_slots(block_ids, self.block_size, num_tokens)

    def planner(
        self,
        *,
        prefill_layout: ParallelLayout,
        decode_layout: ParallelLayout,
        prefill_buffers: Sequence[BufferLayout],
        decode_buffers: Sequence[BufferLayout],
        token_maps: bool = False,
    ) -> PDTransferPlanner:
        """A planner with this runtime's replica rule.

        :param prefill_layout: The prefill side's ranks.
        :param decode_layout: The decode side's ranks.
        :param prefill_buffers: The prefill side's buffers (``buffers(...).buffers``).
        :param decode_buffers: The decode side's buffers.
        :param token_maps: Give token-indexed fragments token geometry (``PDTransferPlanner``).
        """
        return PDTransferPlanner(
            prefill_layout=prefill_layout,
            decode_layout=decode_layout,
            prefill_buffers=prefill_buffers,
            decode_buffers=decode_buffers,
            decode_replicas=self.decode_replicas,
            token_maps=token_maps,
        )
