"""One tiny random-weight model of every family vLLM's CPU backend runs (vLLM 0.32), written
with transformers' own config and model classes: each with the KV cache groups and the cache
kind its family gives vLLM (sliding windows mixed with full attention, every layer sliding,
MLA, Mamba2, Gated DeltaNet and short-conv state beside attention, Mamba2 alone, one KV head;
Gemma-2's head dim is other than hidden / heads; Falcon-H1 and Granite-4.0-H with one B/C group,
which vLLM copies onto every TP rank).

Weights are scaled up from transformers' initialisation so that greedy tokens depend on the
whole context (each family's control in test_model_families.py corrupts one kind of cache and
must change every prompt's tokens) and win by margins the float noise between TP sizes does
not reach; a model's KV or state read wrong decodes other tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Layers and sizes every family shares where its config has them.
SIZES: dict[str, Any] = {
    "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
    "max_position_embeddings": 1024,
}  # fmt: skip
#: The window of the sliding-window families: prompts of 97 tokens and more leave it.
WINDOW = 48
#: Gemma's post-attention norm weight (it scales by ``1 + weight``), before the weights are scaled.
LOUD_ATTENTION = 6.0


@dataclass(frozen=True)
class Family:
    """A tiny model of one family: how to write it, the dtype vLLM runs it in, the cache kinds
    its groups hold (the first is the one its control corrupts), the block size asked of vLLM
    (its CPU backend takes 16 for MLA without AMX), the weights' scale, and the environment
    its instances run with."""

    name: str
    write: Callable[[Path, int], Any]
    dtype: str = "float32"
    kinds: tuple[str, ...] = ("attention",)
    block_size: int = 32
    scale: float = 16.0
    env: tuple[tuple[str, str], ...] = ()
    #: Channels at the end of a rank's Mamba2 conv state that every TP rank holds whole (B and
    #: C of one group, ``2 * state_size``): a control at every TP pair corrupts just them.
    copied_channels: int = 0
    #: The attention backend asked of vLLM, where its own choice depends on the machine: an
    #: fp32 MLA model needs CPU_MLA (vLLM picks AMX_MLA wherever the CPU has AMX tiles, and
    #: AMX_MLA loads bf16 weights only).
    attention_backend: str | None = None


def _scaled(model: Any, folder: Path, scale: float) -> Path:
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(scale)
    model.save_pretrained(folder)
    return folder


def _llama_windowed(config: dict[str, Any]) -> Any:
    import transformers

    kinds = ("sliding_attention", "full_attention")
    layers = config["num_hidden_layers"]
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **config, sliding_window=WINDOW, layer_types=[kinds[i % 2] for i in range(layers)],
    ))  # fmt: skip


def _mistral(config: dict[str, Any]) -> Any:
    import transformers

    return transformers.MistralForCausalLM(
        transformers.MistralConfig(**config, sliding_window=WINDOW)
    )


def _gemma2(config: dict[str, Any]) -> Any:
    import transformers

    # A head dim of 128 beside 4 heads of a 256 hidden size: other than hidden / heads.
    return _loud_attention(transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(**{**config, "head_dim": 128}, sliding_window=WINDOW)
    ))  # fmt: skip


def _loud_attention(model: Any) -> Any:
    """Gemma ties its embeddings (vLLM's Gemma models have no ``lm_head``): the token's own
    embedding, scaled up by the hidden size, would win every step whatever the context. Its
    post-attention norms (``1 + weight``) are raised so attention outweighs it."""
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("post_attention_layernorm.weight"):
                parameter.fill_(LOUD_ATTENTION)
    return model


def _gemma3(config: dict[str, Any]) -> Any:
    import transformers

    return _loud_attention(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **{**config, "num_hidden_layers": 3}, sliding_window=WINDOW, sliding_window_pattern=2,
    )))  # fmt: skip


def _deepseek(version: int) -> Callable[[dict[str, Any]], Any]:
    def build(config: dict[str, Any]) -> Any:
        import transformers

        mla = dict(
            moe_intermediate_size=128, num_hidden_layers=2, first_k_dense_replace=2,
            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=512, q_lora_rank=None,
            qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=4,
            num_experts_per_tok=2,
        )  # fmt: skip
        base = {k: v for k, v in config.items() if k not in mla and k != "head_dim"}
        if version == 3:
            cfg: Any = transformers.DeepseekV3Config(**base, **mla, n_group=1, topk_group=1)
            return transformers.DeepseekV3ForCausalLM(cfg)
        return transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(**base, **mla))

    return build


def _nemotron_h(config: dict[str, Any]) -> Any:
    import transformers

    return transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
        **{**config, "num_hidden_layers": 3}, hybrid_override_pattern="M*-", mamba_num_heads=8,
        mamba_head_dim=32, ssm_state_size=16, n_groups=2, conv_kernel=4, expand=1,
        mamba_chunk_size=64,
    ))  # fmt: skip


def _mamba2(config: dict[str, Any]) -> Any:
    import transformers

    return transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], num_hidden_layers=2,
        num_heads=8, head_dim=64, state_size=16, n_groups=2, conv_kernel=4, expand=2,
        chunk_size=64,
    ))  # fmt: skip


def _qwen3_next(config: dict[str, Any]) -> Any:
    import transformers

    return transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
        **{**config, "num_hidden_layers": 4}, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, full_attention_interval=2,
    ))  # fmt: skip


def _lfm2(config: dict[str, Any]) -> Any:
    import transformers

    # conv_dim and block_dim: the keys published LFM2 configs carry and vLLM's model reads.
    # Two attention layers beside two convs (one KV cache group and one state group of two
    # layers each, sharing their memory), as issue 58 found decoding otherwise.
    return transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        **{**config, "num_hidden_layers": 4},
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        conv_L_cache=3, conv_dim=config["hidden_size"], block_dim=config["hidden_size"],
    ))  # fmt: skip


#: Falcon-H1's and Granite-4.0-H's Mamba2 mixers as published: one B/C group (n_groups 1),
#: which vLLM copies onto every TP rank; a state of 16 (B and C: 32 channels a rank).
ONE_GROUP_STATE = 16


def _falcon_h1(config: dict[str, Any]) -> Any:
    import transformers

    # Attention and a Mamba2 mixer side by side in every layer; vLLM names layer i's mixer
    # model.{num_hidden_layers + i}.mixer.
    return transformers.FalconH1ForCausalLM(transformers.FalconH1Config(
        **config, mamba_d_ssm=256, mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1,
        mamba_d_state=ONE_GROUP_STATE, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=64,
    ))  # fmt: skip


def _granite_hybrid(config: dict[str, Any]) -> Any:
    import transformers

    # Written as published (mamba / attention); transformers 5 saves them as linear_attention
    # / full_attention, the names vLLM's granitemoehybrid.py matches.
    return transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(
        **{**config, "num_hidden_layers": 3}, layer_types=["mamba", "attention", "mamba"],
        mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=ONE_GROUP_STATE,
        mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=64, num_local_experts=0,
        shared_intermediate_size=512,
    ))  # fmt: skip


def _one_head(config: dict[str, Any]) -> Any:
    import transformers

    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**{**config, "num_key_value_heads": 1})
    )


def _writer(build: Callable[[dict[str, Any]], Any], dtype: str, scale: float) -> Callable[
    [Path, int], Any
]:  # fmt: skip
    def write(folder: Path, seed: int = 0) -> Path:
        import torch

        torch.manual_seed(seed)
        config = {
            **SIZES, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "torch_dtype": dtype,
        }  # fmt: skip
        model = build(config)
        if dtype == "bfloat16":
            model = model.to(torch.bfloat16)
        return _scaled(model, folder, scale)

    return write


def _family(name: str, build: Callable[[dict[str, Any]], Any], **kw: Any) -> Family:
    dtype, scale = kw.get("dtype", "float32"), kw.get("scale", 16.0)
    return Family(name, _writer(build, dtype, scale), **kw)


FAMILIES = {
    f.name: f
    for f in (
        _family("llama-windowed", _llama_windowed, kinds=("window", "attention"), scale=16.0),
        _family("mistral", _mistral, kinds=("window",), scale=16.0),
        _family("gemma2", _gemma2, kinds=("window", "attention"), scale=8.0),
        _family("gemma3", _gemma3, kinds=("window", "attention"), scale=8.0),
        _family("one-kv-head", _one_head, scale=16.0),
        _family(
            "deepseek-v3", _deepseek(3), kinds=("mla",), scale=16.0, attention_backend="CPU_MLA"
        ),
        _family("deepseek-v2", _deepseek(2), dtype="bfloat16", kinds=("mla",), scale=16.0),
        # Its conv state dim-first, as vLLM stores it when NixlConnector is configured.
        _family(
            "nemotron-h",
            _nemotron_h,
            kinds=("state", "attention"),
            env=(("VLLM_SSM_CONV_STATE_LAYOUT", "DS"),),
        ),
        _family(
            "qwen3-next", _qwen3_next, dtype="bfloat16", kinds=("state", "attention"), scale=16.0
        ),
        _family("lfm2", _lfm2, kinds=("state", "attention"), scale=16.0),
        _family(
            "falcon-h1",
            _falcon_h1,
            kinds=("state", "attention"),
            copied_channels=2 * ONE_GROUP_STATE,
        ),
        _family(
            "granite-hybrid",
            _granite_hybrid,
            kinds=("state", "attention"),
            copied_channels=2 * ONE_GROUP_STATE,
        ),
        _family("mamba2", _mamba2, kinds=("state",), scale=16.0),
    )
}
