//! Readers of families with state layers (Mamba, Mamba2, Gated `DeltaNet`, KDA, lightning
//! attention, short convs) beside or instead of attention. Each says whose rule it is.

use super::{
    attention_shape, by_kind, check_inner, gated_deltanet, heads_and_split, mamba2, mla,
    named_kinds, uniform, AttentionKeys, MambaKeys, HEADS, HIDDEN, KV_HEADS, STANDARD,
};
use crate::error::{bail, PlanError, PlanResult};
use crate::model::config::{as_u64, field, Config};
use crate::model::layers::{
    AttentionShape, KdaShape, Layer, LightningShape, Mamba1Shape, ShortConvShape,
};

/// Nemotron-H's Mamba2 keys; the inner size is `mamba_num_heads x mamba_head_dim` (vLLM's
/// `nemotron_h.py` never reads `expand`, which Nemotron-3 configs state differently). Older
/// files name the groups and the conv `mamba_n_groups` and `mamba_d_conv`, which transformers
/// 5's `NemotronHConfig` reads first (and saves again as `n_groups`, `conv_kernel`).
const NEMOTRON_MAMBA: MambaKeys = MambaKeys {
    heads: &["mamba_num_heads"],
    head_dim: &["mamba_head_dim"],
    state: &["ssm_state_size"],
    groups: &["mamba_n_groups", "n_groups"],
    conv: &["mamba_d_conv", "conv_kernel"],
};

/// Nemotron-H and Nemotron-3 (vLLM `nemotron_h.py`; transformers `NemotronHConfig`): a kind a
/// layer, from `layers_block_type` (`linear_attention` Mamba2, `full_attention`, `moe`, `mlp`;
/// the legacy `mamba` and `attention` too) or else `hybrid_override_pattern`, a letter a layer
/// (`M` Mamba2, `*` attention, `-` MLP, `E` `MoE`). transformers reads the list where both are
/// given, and vLLM's pattern is derived from it.
pub fn nemotron_h(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    // `layer_types` is the same list by another name (transformers' `attribute_map`).
    let listed = c.first_layer_list(&["layers_block_type", "layer_types"], count)?;
    let kinds_of: Vec<usize> = if let Some(list) = listed {
        list.iter()
            .enumerate()
            .map(|(i, v)| {
                let kind = match v.as_str() {
                    Some("full_attention" | "attention") => 0,
                    Some("linear_attention" | "mamba") => 1,
                    Some("moe" | "mlp") => 2,
                    _ => bail!(
                        "config.json: layers_block_type[{i}] is {v}; pdplan reads \
                         linear_attention (mamba), full_attention (attention), moe and mlp"
                    ),
                };
                Ok(kind)
            })
            .collect::<PlanResult<_>>()?
    } else {
        let key = "hybrid_override_pattern";
        let Some(text) = c.str(key)? else {
            bail!("config.json: a Nemotron-H config must have layers_block_type or {key}");
        };
        let letters: Vec<char> = text.chars().collect();
        if letters.len() as u64 != count {
            bail!(
                "config.json: {key} has {} layers but num_hidden_layers is {count}",
                letters.len()
            );
        }
        letters
            .iter()
            .enumerate()
            .map(|(i, letter)| {
                let kind = match letter {
                    '*' => 0,
                    'M' => 1,
                    '-' | 'E' => 2,
                    other => bail!(
                        "config.json: {key}[{i}] is {other:?}; pdplan reads M (Mamba2), * \
                         (attention), - (MLP) and E (MoE)"
                    ),
                };
                Ok(kind)
            })
            .collect::<PlanResult<_>>()?
    };
    let _ = c.first_u64(&["mamba_expand", "expand"])?;
    let keys = AttentionKeys {
        head_dim: &["head_dim", "attention_head_dim"],
        ..STANDARD
    };
    let attention = || Ok(Layer::Attention(attention_shape(c, keys)?));
    let mamba = || Ok(Layer::Mamba2(mamba2(c, &NEMOTRON_MAMBA, None)?));
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 3] = [&attention, &mamba, &|| Ok(Layer::Mlp)];
    by_kind(count, &kinds, |i| {
        let at = usize::try_from(i).unwrap_or(usize::MAX);
        kinds_of.get(at).copied().ok_or_else(|| {
            PlanError::new(format!(
                "config.json: layer {i} has no kind (a bug in pdplan)"
            ))
        })
    })
}

/// Jamba (transformers `JambaConfig`, vLLM `jamba.py`): attention at layers `i %
/// attn_layer_period == attn_layer_offset`, Mamba (v1) elsewhere, of `mamba_expand x
/// hidden_size` channels.
pub fn jamba(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let period = c.positive("attn_layer_period")?.unwrap_or(8);
    let offset = c.u64("attn_layer_offset")?.unwrap_or(4);
    if offset >= period {
        bail!("config.json: attn_layer_offset={offset} must be below attn_layer_period={period}");
    }
    let attention = || Ok(Layer::Attention(attention_shape(c, STANDARD)?));
    let mamba = || {
        let what = "a Mamba layer";
        let expand = c.require(&["mamba_expand"], what)?;
        let hidden = c.require(&["hidden_size"], what)?;
        Ok(Layer::Mamba1(Mamba1Shape {
            inner_size: expand
                .checked_mul(hidden)
                .ok_or_else(|| PlanError::new("config.json: the Mamba inner size overflows"))?,
            state_size: c.require(&["mamba_d_state"], what)?,
            conv_kernel: c.require(&["mamba_d_conv"], what)?,
        }))
    };
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&attention, &mamba];
    by_kind(count, &kinds, |i| Ok(usize::from(i % period != offset)))
}

/// Bamba's and Granite 4.0-H's Mamba2 keys.
const GRANITE_MAMBA: MambaKeys = MambaKeys {
    heads: &["mamba_n_heads"],
    head_dim: &["mamba_d_head"],
    state: &["mamba_d_state"],
    groups: &["mamba_n_groups"],
    conv: &["mamba_d_conv"],
};

fn granite_mamba(c: &Config) -> PlanResult<Layer> {
    let m = mamba2(c, &GRANITE_MAMBA, None)?;
    check_inner(c, "mamba_expand", &m)?;
    Ok(Layer::Mamba2(m))
}

/// Granite 4.0-H (vLLM `granitemoehybrid.py`): `layer_types` of `"mamba"` and `"attention"`
/// (transformers 5 writes `linear_attention` and `full_attention`), or the same list as
/// `layers_block_type` (transformers' `attribute_map`).
pub fn granite_hybrid(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let listed = c.first_layer_list(&["layer_types", "layers_block_type"], count)?;
    let Some(types) = listed else {
        bail!("config.json: a Granite 4.0-H config must list layer_types (or layers_block_type)");
    };
    let attention = || Ok(Layer::Attention(attention_shape(c, STANDARD)?));
    let mamba = || granite_mamba(c);
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&attention, &mamba];
    by_kind(
        count,
        &kinds,
        named_kinds("layer_types", types, &[("attention", 0), ("mamba", 1)]),
    )
}

/// Bamba (transformers `BambaConfig.layers_block_type`): attention at `attn_layer_indices`,
/// Mamba2 elsewhere; or a `layers_block_type` list of `"attention"` and `"mamba"`.
pub fn bamba(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let attention = || Ok(Layer::Attention(attention_shape(c, STANDARD)?));
    let mamba = || granite_mamba(c);
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&attention, &mamba];
    if let Some(types) = c.layer_list("layers_block_type", count)? {
        return by_kind(
            count,
            &kinds,
            named_kinds(
                "layers_block_type",
                types,
                &[("attention", 0), ("mamba", 1)],
            ),
        );
    }
    let at = c
        .indices("attn_layer_indices", count, false)?
        .unwrap_or_default();
    by_kind(count, &kinds, |i| Ok(usize::from(!at.contains(&i))))
}

/// Falcon-H1 (vLLM `falcon_h1.py`): attention and Mamba2 side by side in every layer;
/// `mamba_d_head` may be `"auto"`, then `mamba_d_ssm / mamba_n_heads`.
pub fn falcon_h1(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let keys = MambaKeys {
        heads: &["mamba_n_heads"],
        head_dim: &["mamba_d_head"],
        state: &["mamba_d_state"],
        groups: &["mamba_n_groups"],
        conv: &["mamba_d_conv"],
    };
    let heads = c.require(keys.heads, "a Mamba2 layer")?;
    let ssm = c.u64("mamba_d_ssm")?;
    let head_dim = match c.get("mamba_d_head")? {
        Some(serde_json::Value::String(auto)) if auto == "auto" => None,
        Some(_) => c.u64("mamba_d_head")?,
        None => None,
    };
    let head_dim = match (head_dim, ssm) {
        (Some(dim), _) => dim,
        (None, Some(ssm)) if heads > 0 && ssm % heads == 0 => ssm / heads,
        (None, Some(ssm)) => {
            bail!("config.json: mamba_d_ssm={ssm} is not a multiple of mamba_n_heads={heads}")
        }
        (None, None) => {
            bail!("config.json has no mamba_d_head or mamba_d_ssm, which a Mamba2 layer needs")
        }
    };
    let m = mamba2(c, &keys, Some(head_dim))?;
    if let Some(ssm) = ssm.filter(|&s| s != heads.saturating_mul(head_dim)) {
        bail!(
            "config.json: the Mamba2 inner size is {ssm} (mamba_d_ssm), but {heads} heads x head \
             dim {head_dim} make {}; check the config's Mamba2 keys",
            heads.saturating_mul(head_dim)
        );
    }
    let _ = c.u64("mamba_expand")?;
    Ok(uniform(
        count,
        Layer::AttentionMamba2(attention_shape(c, STANDARD)?, m),
    ))
}

/// Pure Mamba (transformers `MambaConfig`): `intermediate_size` channels (else `expand x
/// hidden_size`), `state_size`, `conv_kernel`.
pub fn mamba(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let what = "a Mamba layer";
    let inner = match c.u64("intermediate_size")? {
        Some(inner) => inner,
        None => c
            .require(&["expand"], what)?
            .checked_mul(c.require(&["hidden_size"], what)?)
            .ok_or_else(|| PlanError::new("config.json: the Mamba inner size overflows"))?,
    };
    Ok(uniform(
        count,
        Layer::Mamba1(Mamba1Shape {
            inner_size: inner,
            state_size: c.require(&["state_size"], what)?,
            conv_kernel: c.require(&["conv_kernel"], what)?,
        }),
    ))
}

/// Pure Mamba2 (transformers `Mamba2Config`, vLLM `mamba2.py`): `num_heads x head_dim`
/// channels, which `expand x hidden_size` must equal.
pub fn mamba2_stack(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let keys = MambaKeys {
        heads: &["num_heads"],
        head_dim: &["head_dim"],
        state: &["state_size"],
        groups: &["n_groups"],
        conv: &["conv_kernel"],
    };
    let m = mamba2(c, &keys, None)?;
    check_inner(c, "expand", &m)?;
    Ok(uniform(count, Layer::Mamba2(m)))
}

/// Zamba2 (transformers `Zamba2Config`, vLLM `zamba2.py`): every layer a Mamba2 mixer; the
/// `"hybrid"` layers of `layers_block_type` (`hybrid_layer_ids`) also apply a shared attention
/// block, whose every application keeps its own KV: `num_key_value_heads` heads of
/// `attention_head_dim` (default `2 x hidden_size / num_attention_heads`, the block attending
/// over the concatenated input). Mamba heads `n_mamba_heads` of `mamba_headdim` (default
/// `mamba_expand x hidden_size / n_mamba_heads`).
pub fn zamba2(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let hybrid: Vec<u64> = if let Some(types) = c.layer_list("layers_block_type", count)? {
        let kind = named_kinds("layers_block_type", types, &[("mamba", 0), ("hybrid", 1)]);
        (0..count)
            .filter_map(|i| kind(i).map(|k| (k == 1).then_some(i)).transpose())
            .collect::<PlanResult<_>>()?
    } else if let Some(ids) = c.indices("hybrid_layer_ids", count, false)? {
        ids
    } else {
        bail!("config.json: a Zamba2 config must list layers_block_type or hybrid_layer_ids");
    };
    if let Some(ids) = c.indices("hybrid_layer_ids", count, false)? {
        if ids != hybrid {
            bail!("config.json: hybrid_layer_ids {ids:?} disagree with layers_block_type's hybrid layers {hybrid:?}");
        }
    }
    let what = "a Zamba2 layer";
    let hidden = c.require(&["hidden_size"], what)?;
    let mamba_heads = c.require(&["n_mamba_heads"], what)?;
    let expand = c.require(&["mamba_expand"], what)?;
    let inner = expand.saturating_mul(hidden);
    let head_dim = match c.u64("mamba_headdim")? {
        Some(dim) => dim,
        None if mamba_heads > 0 && inner % mamba_heads == 0 => inner / mamba_heads,
        None => bail!("config.json: mamba_expand x hidden_size={inner} is not a multiple of n_mamba_heads={mamba_heads}"),
    };
    let keys = MambaKeys {
        heads: &["n_mamba_heads"],
        head_dim: &["mamba_headdim"],
        state: &["mamba_d_state"],
        groups: &["mamba_ngroups"],
        conv: &["mamba_d_conv"],
    };
    let m = mamba2(c, &keys, Some(head_dim))?;
    let heads = c.require(HEADS, what)?;
    // The shared block attends over [hidden state, embedding]: twice the hidden size.
    let doubled = hidden.saturating_mul(2);
    let attention_dim = match c.u64("attention_head_dim")? {
        Some(dim) => dim,
        None if heads > 0 && doubled % heads == 0 => doubled / heads,
        None => bail!(
            "config.json: 2 x hidden_size={doubled} is not a multiple of num_attention_heads={heads}"
        ),
    };
    let kv_heads = c.u64("num_key_value_heads")?.unwrap_or(heads);
    let attention = AttentionShape::full(kv_heads, attention_dim);
    Ok((0..count)
        .map(|i| {
            if hybrid.contains(&i) {
                Layer::AttentionMamba2(attention, m)
            } else {
                Layer::Mamba2(m)
            }
        })
        .collect())
}

/// LFM2 (transformers `Lfm2Config`, vLLM `lfm2.py`): `layer_types` of `"conv"` and
/// `"full_attention"` (older configs: attention at `full_attn_idxs`); a conv layer keeps
/// `conv_dim` (default `hidden_size`) channels of `conv_L_cache - 1` inputs.
pub fn lfm2(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let attention = || Ok(Layer::Attention(attention_shape(c, STANDARD)?));
    let conv = || {
        let what = "a short-conv layer";
        let channels = match c.u64("conv_dim")? {
            Some(dim) => dim,
            None => c.require(&["hidden_size"], what)?,
        };
        Ok(Layer::ShortConv(ShortConvShape {
            channels,
            conv_kernel: c.require(&["conv_L_cache"], what)?,
        }))
    };
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&attention, &conv];
    if let Some(types) = c.layer_list("layer_types", count)? {
        return by_kind(
            count,
            &kinds,
            named_kinds("layer_types", types, &[("full_attention", 0), ("conv", 1)]),
        );
    }
    let Some(at) = c.indices("full_attn_idxs", count, false)? else {
        bail!("config.json: an LFM2 config must list layer_types or full_attn_idxs");
    };
    by_kind(count, &kinds, |i| Ok(usize::from(!at.contains(&i))))
}

/// Qwen3-Next and Qwen3.5 (vLLM `qwen3_next.py`/`qwen3_5.py`): `layer_types` of
/// `"linear_attention"` (Gated `DeltaNet`) and `"full_attention"`, or else every
/// `full_attention_interval`-th layer full; where both are given they must agree.
pub fn qwen3_next(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let interval = c.positive("full_attention_interval")?;
    let attention = || Ok(Layer::Attention(attention_shape(c, STANDARD)?));
    let linear = || gated_deltanet(c);
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&attention, &linear];
    let by_interval = |i: u64| interval.map(|n| usize::from((i + 1) % n != 0));
    if let Some(types) = c.layer_list("layer_types", count)? {
        let kind = named_kinds(
            "layer_types",
            types,
            &[("full_attention", 0), ("linear_attention", 1)],
        );
        return by_kind(count, &kinds, |i| {
            let k = kind(i)?;
            if by_interval(i).is_some_and(|want| want != k) {
                bail!(
                    "config.json: layer_types[{i}] disagrees with full_attention_interval={}",
                    interval.unwrap_or(0)
                );
            }
            Ok(k)
        });
    }
    if interval.is_none() {
        bail!("config.json: this family needs layer_types or full_attention_interval to place its linear-attention layers");
    }
    by_kind(count, &kinds, |i| Ok(by_interval(i).unwrap_or(0)))
}

/// Kimi-Linear (vLLM `kimi_linear.py`, `KimiLinearConfig.is_kda_layer`): `linear_attn_config`
/// lists `kda_layers` and `full_attn_layers`, counted from 1; KDA layers keep `num_heads` heads
/// of `head_dim` (recurrent state and the q, k, v conv states of `short_conv_kernel_size`), the
/// others MLA.
pub fn kimi_linear(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let key = "linear_attn_config";
    let Some(linear) = c.get(key)? else {
        bail!("config.json: a Kimi-Linear config must have {key}");
    };
    let number = |name: &str| -> PlanResult<u64> {
        field(linear, name, key)?
            .map(|v| as_u64(v, &format!("{key}.{name}")))
            .transpose()?
            .ok_or_else(|| PlanError::new(format!("config.json: {key} has no {name}")))
    };
    let layers = |name: &str| -> PlanResult<Vec<u64>> {
        let Some(list) = field(linear, name, key)?.and_then(|v| v.as_array()) else {
            bail!("config.json: {key}.{name} must list layers");
        };
        list.iter()
            .map(|v| match as_u64(v, &format!("{key}.{name}"))? {
                at @ 1.. if at <= count => Ok(at - 1),
                at => bail!("config.json: {key}.{name} names layer {at}, outside the model's {count} layers (counted from 1)"),
            })
            .collect()
    };
    let (kda_layers, full_layers) = (layers("kda_layers")?, layers("full_attn_layers")?);
    for i in 0..count {
        if kda_layers.contains(&i) == full_layers.contains(&i) {
            bail!("config.json: layer {} must be in exactly one of {key}.kda_layers and {key}.full_attn_layers", i + 1);
        }
    }
    let kda = Layer::Kda(KdaShape {
        heads: number("num_heads")?,
        head_dim: number("head_dim")?,
        conv_kernel: number("short_conv_kernel_size")?,
    });
    for k in [
        "num_key_value_heads",
        "qk_nope_head_dim",
        "v_head_dim",
        "head_dim",
    ] {
        let _ = c.u64(k)?;
    }
    let latent = Layer::Mla(mla(c, false)?);
    Ok((0..count)
        .map(|i| if kda_layers.contains(&i) { kda } else { latent })
        .collect())
}

/// `MiniMax`-Text-01 and M1 (vLLM `minimax_text_01.py`): `attn_type_list[i]` 0 is a lightning
/// (linear) attention layer of `num_attention_heads` heads of `head_dim` (state `[heads,
/// head_dim, head_dim]`), 1 full attention.
pub fn minimax_text01(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let Some(list) = c.layer_list("attn_type_list", count)? else {
        bail!("config.json: a MiniMax-Text-01 config must list attn_type_list");
    };
    let keys = AttentionKeys {
        heads: HEADS,
        kv_heads: KV_HEADS,
        head_dim: &["head_dim"],
        hidden: HIDDEN,
    };
    let attention = || Ok(Layer::Attention(attention_shape(c, keys)?));
    let lightning = || {
        let heads = c.require(HEADS, "a lightning attention layer")?;
        let head_dim = match c.u64("head_dim")? {
            Some(dim) => dim,
            None => heads_and_split(c, keys, "a lightning attention layer")?.1,
        };
        Ok(Layer::Lightning(LightningShape { heads, head_dim }))
    };
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&attention, &lightning];
    by_kind(count, &kinds, |i| {
        match as_u64(&list[usize::try_from(i).unwrap_or(0)], "attn_type_list")? {
        1 => Ok(0),
        0 => Ok(1),
        other => bail!("config.json: attn_type_list[{i}] is {other}; 0 is lightning attention, 1 full attention"),
    }
    })
}
