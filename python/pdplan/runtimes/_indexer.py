"""An MLA indexer's key cache (DeepSeek-V3.2), the same in vLLM and SGLang: a page of
``page_size`` tokens holds every token's fp8 keys, then every token's fp32 scales (one a 128
keys), whatever shape the runtime gives the tensor. Described as its two parts, each a buffer
with the whole page as its stride (``page_parts``)."""

from __future__ import annotations

from typing import Any

from pdplan._arrays import buffer_from_array, page_parts
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout


def indexer_parts(width: int) -> tuple[int, int]:
    """The two parts of an MLA indexer page's token, in bytes: ``keys`` fp8 values, then one
    fp32 scale for each 128 of them (132 bytes a token: 128 and 4).

    :param width: Bytes a token has in the page, both parts.
    """
    for keys in range(1, width):
        if keys + 4 * -(-keys // 128) == width:
            return keys, width - keys
    raise UnsupportedPDLayoutError(
        f"an MLA indexer cache of {width} bytes a token is not keys and their fp32 scales "
        "(one a 128 keys); pass it as its runtime allocates it"
    )


def indexer_buffers(
    first_index: int, array: Any, page_size: int, token_bytes: int, tp_size: int, layer: int
) -> list[tuple[BufferLayout, int, int]]:
    """The keys and the scales of one layer's indexer cache ``array`` (pages outermost,
    ``page_size * token_bytes`` bytes a page), numbered from ``first_index``."""
    return [
        buffer_from_array(
            first_index + i,
            BufferKind.TARGET_K,
            part,
            ("page", "token", "dim"),
            tp_size=tp_size,
            layer=layer,
        )
        for i, part in enumerate(page_parts(array, page_size, indexer_parts(token_bytes)))
    ]
