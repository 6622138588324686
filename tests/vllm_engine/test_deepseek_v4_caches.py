"""DeepSeek-V4's caches as pdplan reads them from the published config files, held to the KV
cache specs vLLM itself builds from the same files (``deepseek_v4_specs.py``: vLLM's own
model classes, in this venv's vLLM 0.32): every cache of every layer, in order, with its
items a page, its content and padded page bytes, its window, one replicated head. Both of
vLLM's latent layouts: ``fp8_ds_mla`` (its default) and plain bf16 rows."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from deepseek_v4_specs import shrunk

from pdplan import ModelShape, model_buffer_layouts

pytestmark = pytest.mark.vllm

CORPUS = Path(__file__).parents[1] / "data" / "published_configs"
PROBE = Path(__file__).with_name("deepseek_v4_specs.py")
#: Each layer's caches in pdplan's order, by the suffix of vLLM's layer name.
ORDER = (
    ".attn.swa_cache",
    ".attn",
    ".attn.compressor.state_cache",
    ".attn.indexer.k_cache",
    ".attn.indexer.compressor.state_cache",
)
CASES = [
    ("deepseek-v4-flash", "auto", False),
    ("deepseek-v4-flash", "bfloat16", True),
    ("deepseek-v4-pro", "auto", False),
    ("deepseek-v4-flash-0731", "auto", False),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def vllm_specs(model: str, cache_dtype: str, plain: bool, tmp: Path) -> list[dict[str, Any]]:
    """vLLM's spec of every cache, ordered by layer, then as pdplan orders a layer's caches."""
    config = json.loads((CORPUS / model / "config.json").read_text())
    (tmp / "config.json").write_text(json.dumps(shrunk(config)))
    env = {
        **os.environ,
        "PROBE_PORT": str(free_port()),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
    }
    args = [sys.executable, str(PROBE), str(tmp), cache_dtype, *(["plain"] if plain else [])]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    specs: dict[str, dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])

    def key(name: str) -> tuple[int, int]:
        layer = int(name.split(".")[2])
        suffix = name[len(f"model.layers.{layer}") :]
        return layer, ORDER.index(suffix)

    return [specs[name] for name in sorted(specs, key=key)]


@pytest.mark.parametrize(("model", "cache_dtype", "plain"), CASES)
def test_every_cache_matches_the_spec_vllm_builds(
    model: str, cache_dtype: str, plain: bool, tmp_path: Path
) -> None:
    want = vllm_specs(model, cache_dtype, plain, tmp_path)
    shape = replace(ModelShape.from_hf_config(CORPUS / model), page_size=256)
    if plain:
        shape = replace(shape, kv_cache_dtype="bfloat16")
    for tp in (1, 4):
        got, _ = model_buffer_layouts(shape, tp, tp)
        assert len(got) == len(want), f"{len(got)} buffers, vLLM builds {len(want)} caches"
        for index, (buffer, spec) in enumerate(zip(got, want)):
            assert (spec["num_kv_heads"], spec["max_tp_shards"]) == (1, 1)
            assert buffer.logical_axis == "replicated", index
            assert buffer.page_size == spec["states"], index
            assert buffer.item_stride_bytes == spec["page_size_bytes"], index
            content = buffer.page_bytes or buffer.item_stride_bytes
            assert content == spec["real_page_size_bytes"], index
            assert buffer.sliding_window == spec["sliding_window"], index
