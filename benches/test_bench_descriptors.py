"""pytest-benchmark: per-request descriptors for one 32k-token request of a 70B model (prefill
TP 8 -> decode TP 2), pdplan against the Python loop and a vectorized numpy version.

    pytest benches --benchmark-enable --benchmark-group-by=group
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pdplan

import pure_python
from scenarios import llama70b_request

REQUEST = llama70b_request()
ARGS = (
    REQUEST.fragments,
    REQUEST.src_bases,
    REQUEST.dst_bases,
    REQUEST.src_pages,
    REQUEST.dst_pages,
)
EXPECTED = pure_python.descriptors_loop(*ARGS)


@pytest.mark.benchmark(group="descriptors 70B 32k tokens")
def test_descriptors_pdplan(benchmark: Any) -> None:
    out = benchmark(
        pdplan.transfer_descriptors,
        *ARGS,
        coalesce=False,
        src_limits=REQUEST.src_limits,
        dst_limits=REQUEST.dst_limits,
    )
    assert out.num_descriptors == len(EXPECTED) == 160 * 2048
    assert [tuple(row) for row in out.as_array().tolist()] == EXPECTED


@pytest.mark.benchmark(group="descriptors 70B 32k tokens")
def test_descriptors_pdplan_coalesced(benchmark: Any) -> None:
    out = benchmark(
        pdplan.transfer_descriptors,
        *ARGS,
        src_limits=REQUEST.src_limits,
        dst_limits=REQUEST.dst_limits,
    )
    assert out.total_bytes == sum(row[2] for row in EXPECTED)


@pytest.mark.benchmark(group="descriptors 70B 32k tokens")
def test_descriptors_numpy(benchmark: Any) -> None:
    src, dst, lengths = benchmark(pure_python.descriptors_numpy, *ARGS)
    assert np.array_equal(np.column_stack((src, dst, lengths)), np.array(EXPECTED, np.uint64))


@pytest.mark.benchmark(group="descriptors 70B 32k tokens")
def test_descriptors_python_loop(benchmark: Any) -> None:
    out = benchmark.pedantic(pure_python.descriptors_loop, args=ARGS, rounds=1)
    assert out == EXPECTED


NHD = llama70b_request(kv_layout="NHD")
NHD_ARGS = (NHD.fragments, NHD.src_bases, NHD.dst_bases, NHD.src_pages, NHD.dst_pages)


@pytest.mark.benchmark(group="descriptors 70B 32k tokens, NHD pages")
def test_descriptors_nhd_pdplan(benchmark: Any) -> None:
    out = benchmark(
        pdplan.transfer_descriptors,
        *NHD_ARGS,
        coalesce=False,
        src_limits=NHD.src_limits,
        dst_limits=NHD.dst_limits,
    )
    assert out.num_descriptors == 160 * 2048 * 16
    expected = pure_python.descriptors_numpy(*NHD_ARGS)
    assert all(np.array_equal(a, b) for a, b in zip(out, expected))


@pytest.mark.benchmark(group="descriptors 70B 32k tokens, NHD pages")
def test_descriptors_nhd_numpy(benchmark: Any) -> None:
    src, _, lengths = benchmark(pure_python.descriptors_numpy, *NHD_ARGS)
    assert len(src) == 160 * 2048 * 16 and set(lengths.tolist()) == {256}


@pytest.mark.benchmark(group="token descriptors 70B 32k tokens, 16 -> 64")
def test_token_descriptors_pdplan(benchmark: Any) -> None:
    from tokens import Case

    case = Case(16, 64)
    out = benchmark(case.tokens, coalesce=False)
    # Each 16-token source page lies inside one 64-token decode page: one descriptor each.
    assert out.num_descriptors == 160 * 2048
    assert out.total_bytes == 160 * 32768 * 256


@pytest.mark.benchmark(group="token descriptors 70B 32k tokens, 16 -> 64")
def test_token_descriptors_numpy(benchmark: Any) -> None:
    from tokens import Case

    case = Case(16, 64)
    assert benchmark(case.numpy_per_token) == 160 * 32768
