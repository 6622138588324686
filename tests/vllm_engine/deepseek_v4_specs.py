"""Prints, as JSON, the KV cache spec vLLM builds for each cache of a DeepSeek-V4 model: the
model is built by vLLM itself (its CPU classes, one process, random weights) from a
``config.json`` whose cache keys are the published file's and whose other sizes are shrunk so
it fits (``shrunk``). Run in the vLLM venv: ``python deepseek_v4_specs.py MODEL_DIR
[CACHE_DTYPE [plain]]``; ``plain`` builds the plain-row layout (FlashInfer's sparse backend
on GPUs) by turning off the attention class's ``use_fp8_ds_mla_layout``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: Sizes that shape weights, not caches, and what a one-process CPU build can hold.
SMALL = {
    "hidden_size": 256,
    "moe_intermediate_size": 64,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 512,
    "q_lora_rank": 128,
    "o_lora_rank": 128,
    "num_attention_heads": 16,
    "max_position_embeddings": 8192,
}


def shrunk(config: dict[str, Any]) -> dict[str, Any]:
    """The published config with only the weight sizes above made small."""
    out = {**config, **{k: v for k, v in SMALL.items() if k in config}}
    scaling = dict(out.get("rope_scaling") or {})
    if "original_max_position_embeddings" in scaling:
        scaling["original_max_position_embeddings"] = 512
        out["rope_scaling"] = scaling
    return out


def specs(model_dir: str, cache_dtype: str, plain: bool) -> dict[str, dict[str, Any]]:
    import torch
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        VllmConfig,
        get_layers_from_vllm_config,
        set_current_vllm_config,
    )
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model

    # Only the layers' cache specs are read: no weight is loaded and no GEMM runs, so the
    # published config's fp8 linear layers may take vLLM's AMX kernel on a CPU without AMX
    # (which vLLM otherwise refuses to build; machines of this project differ in it).
    torch.cpu._is_amx_tile_supported = lambda: True
    if plain:
        from vllm.models.deepseek_v4.attention import DeepseekV4Attention

        DeepseekV4Attention.use_fp8_ds_mla_layout = False
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=4096)
    config = VllmConfig(
        model_config=model, cache_config=CacheConfig(block_size=256, cache_dtype=cache_dtype)
    )
    out: dict[str, dict[str, Any]] = {}
    with set_current_vllm_config(config):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{os.environ['PROBE_PORT']}", 0, "gloo")
        initialize_model_parallel(1, 1)
        initialize_model(vllm_config=config)
        for name, layer in get_layers_from_vllm_config(config, AttentionLayerBase).items():
            spec = layer.get_kv_cache_spec(config)
            if spec is None:
                continue
            out[name] = {
                "type": type(spec).__name__,
                "block_size": spec.block_size,
                "states": spec.num_states,
                "page_size_bytes": spec.page_size_bytes,
                "real_page_size_bytes": spec.real_page_size_bytes,
                "sliding_window": getattr(spec, "sliding_window", None),
                "num_kv_heads": spec.num_kv_heads,
                "max_tp_shards": spec.max_tp_shards,
            }
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    found = specs(args[0], args[1] if len(args) > 1 else "auto", "plain" in args[2:])
    print(json.dumps(found))
