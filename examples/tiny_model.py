"""Writes the tiny random-weight model the serving guide and the real-engine tests run: a
2-layer Llama with GQA (4 query heads, 2 KV heads of 64 dims) in float32, 512 tokens of
vocabulary; no tokenizer (serve it with ``--skip-tokenizer-init``, prompts as token ids).

    python examples/tiny_model.py /tmp/tiny-llama && export MODEL=/tmp/tiny-llama

Needs ``torch`` and ``transformers`` (the vLLM venv has both)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def write_model(
    folder: Path, arch: str = "llama", seed: int = 0, layers: int = 2, kv_heads: int = 2,
    window: int | None = None, heads: int = 4, head_dim: int = 64, positions: int = 1024,
) -> Path:  # fmt: skip
    """A tiny random-weight model in ``folder``: Llama with GQA, or Qwen3 (the same with q/k
    norms). With ``window``, the Llama's even layers attend over a sliding window of that many
    tokens (``layer_types``, as vLLM's Llama reads them; its odd layers stay full): a hybrid
    cache of two KV cache groups. ``heads`` and ``head_dim`` size the attention (a KV-heavy
    model: more KV heads of more dims), ``positions`` the longest sequence. The same seed writes
    the same weights."""
    import torch
    import transformers

    torch.manual_seed(seed)
    common = dict(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=positions, torch_dtype="float32",
    )  # fmt: skip
    if window is not None:
        kinds = ("sliding_attention", "full_attention")
        common.update(sliding_window=window, layer_types=[kinds[i % 2] for i in range(layers)])
    if arch == "llama":
        config: Any = transformers.LlamaConfig(**common)
        model: Any = transformers.LlamaForCausalLM(config)
    elif arch == "qwen3":
        config = transformers.Qwen3Config(**common)
        model = transformers.Qwen3ForCausalLM(config)
    else:
        raise ValueError(f"no tiny {arch!r}: llama or qwen3")
    # Larger weights than the default init, so greedy tokens depend on the whole context.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)
    model.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where to write it (created)")
    folder = write_model(parser.parse_args().folder)
    print(f"wrote a tiny random-weight Llama to {folder}")


if __name__ == "__main__":
    main()
