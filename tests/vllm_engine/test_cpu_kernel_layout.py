"""vLLM's CPU attention kernel lays a token's K and V out as pdplan's ``token_pieces=(head_size,
1)`` and tests/test_cpu_block_sizes.py's oracle say (``write``): one token written with vLLM's
own ``cpu_attn_reshape_and_cache`` lands there, at two block sizes, and the kernel is the
``"vec"`` one pdplan reads token by token. Run by scripts/test_vllm.sh (CI), which installs
vLLM."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from pdplan.runtimes import vllm as vllm_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def oracle() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "test_cpu_block_sizes.py"
    spec = importlib.util.spec_from_file_location("cpu_block_sizes_oracle", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("block", [32, 128])
def test_the_vec_kernel_lays_k_and_v_out_as_described(block: int) -> None:
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    cpu = oracle()
    heads, head_dim = 2, 32
    isa = _get_attn_isa(torch.float32, block, head_dim)
    assert isa == vllm_adapter.CPU_TOKEN_ISA, isa
    tensor = torch.full((3, heads, block, 2 * head_dim), cpu.GUARD)
    key_cache, value_cache = tensor.view(3, heads, 2 * block, head_dim).chunk(2, dim=2)
    key = [[cpu.value(0, 5, h, 0, d) for d in range(head_dim)] for h in range(heads)]
    val = [[cpu.value(0, 5, h, 1, d) for d in range(head_dim)] for h in range(heads)]
    slot = 1 * block + 7
    ops.cpu_attn_reshape_and_cache(
        torch.tensor(key)[None], torch.tensor(val)[None], key_cache, value_cache,
        torch.tensor([slot]), isa,
    )  # fmt: skip
    want = np.full((3, heads, block, 2 * head_dim), cpu.GUARD, np.float32)
    cpu.write(want, slot, 0, 5, range(heads), head_dim)
    np.testing.assert_array_equal(tensor.numpy(), want)
