//! Each family's reader: the rule its modeling code follows, written for it (`families.rs` maps
//! architectures to these). Helpers here read the parts many families share: an attention
//! layer's heads, a latent, a Mamba2 mixer, a layer-kind list.

pub mod attention;
pub mod deepseek_v4;
pub mod defaults;
pub mod state;

use serde_json::Value;

use super::config::Config;
use super::layers::{AttentionShape, GatedDeltaNetShape, Layer, Mamba2Shape, MlaShape};
use crate::error::{bail, PlanError, PlanResult};

/// The attention-shape keys most families use.
pub const HEADS: &[&str] = &["num_attention_heads"];
pub const KV_HEADS: &[&str] = &["num_key_value_heads"];
pub const HEAD_DIM: &[&str] = &["head_dim"];
pub const HIDDEN: &[&str] = &["hidden_size"];

/// Where a family names an attention layer's sizes.
#[derive(Clone, Copy)]
pub struct AttentionKeys {
    pub heads: &'static [&'static str],
    pub kv_heads: &'static [&'static str],
    pub head_dim: &'static [&'static str],
    pub hidden: &'static [&'static str],
}

pub const STANDARD: AttentionKeys = AttentionKeys {
    heads: HEADS,
    kv_heads: KV_HEADS,
    head_dim: HEAD_DIM,
    hidden: HIDDEN,
};

/// Query heads, and `hidden_size / heads` (the head dim of configs that name none).
pub fn heads_and_split(c: &Config, keys: AttentionKeys, what: &str) -> PlanResult<(u64, u64)> {
    let heads = c.require(keys.heads, what)?;
    let hidden = c.require(keys.hidden, what)?;
    if heads == 0 || hidden % heads != 0 {
        bail!(
            "config.json: {}={hidden} is not a multiple of {}={heads}, and there is no {}",
            keys.hidden[0],
            keys.heads[0],
            keys.head_dim.first().unwrap_or(&"head_dim")
        );
    }
    Ok((heads, hidden / heads))
}

/// Full attention as `keys` name it: KV heads default to the query heads (no GQA), the head
/// dim to `hidden_size / heads`.
pub fn attention_shape(c: &Config, keys: AttentionKeys) -> PlanResult<AttentionShape> {
    let what = "an attention layer";
    let heads = c.require(keys.heads, what)?;
    let kv_heads = c.first_u64(keys.kv_heads)?.unwrap_or(heads);
    let head_dim = match c.first_u64(keys.head_dim)? {
        Some(dim) => dim,
        None => heads_and_split(c, keys, what)?.1,
    };
    Ok(AttentionShape::full(kv_heads, head_dim))
}

/// The window named by `key`, required positive.
pub fn window(c: &Config, key: &str, why: &str) -> PlanResult<u64> {
    match c.u64(key)? {
        Some(w) if w > 0 => Ok(w),
        _ => bail!("config.json: {why} names sliding-window layers but no positive {key}"),
    }
}

/// A DeepSeek-style latent: `kv_lora_rank` (required), the rope part, and (for families that
/// have one) an indexer.
pub fn mla(c: &Config, indexer: bool) -> PlanResult<MlaShape> {
    let rank = c.require(&["kv_lora_rank"], "a latent (MLA) attention layer")?;
    if rank == 0 {
        bail!("config.json: kv_lora_rank must be positive");
    }
    Ok(MlaShape {
        kv_lora_rank: rank,
        rope_head_dim: c.u64("qk_rope_head_dim")?.unwrap_or(0),
        index_head_dim: if indexer {
            c.u64("index_head_dim")?.unwrap_or(0)
        } else {
            0
        },
    })
}

/// Where a family names a Mamba2 mixer's sizes.
pub struct MambaKeys {
    pub heads: &'static [&'static str],
    pub head_dim: &'static [&'static str],
    pub state: &'static [&'static str],
    pub groups: &'static [&'static str],
    pub conv: &'static [&'static str],
}

/// A Mamba2 mixer of `heads` x `head_dim` channels.
pub fn mamba2(c: &Config, keys: &MambaKeys, head_dim: Option<u64>) -> PlanResult<Mamba2Shape> {
    let what = "a Mamba2 layer";
    let heads = c.require(keys.heads, what)?;
    let head_dim = match head_dim {
        Some(dim) => dim,
        None => c.require(keys.head_dim, what)?,
    };
    Ok(Mamba2Shape {
        heads,
        head_dim,
        state_size: c.require(keys.state, what)?,
        groups: c.first_u64(keys.groups)?.unwrap_or(1),
        conv_kernel: c.require(keys.conv, what)?,
    })
}

/// `expand x hidden_size`, which some families state as the mixer's inner size: it must be
/// the heads x head dim the mixer is read with, else the config is misread.
pub fn check_inner(c: &Config, expand_key: &str, m: &Mamba2Shape) -> PlanResult<()> {
    let (Some(expand), Some(hidden)) = (c.u64(expand_key)?, c.u64("hidden_size")?) else {
        return Ok(());
    };
    let stated = expand.saturating_mul(hidden);
    let inner = m.heads.saturating_mul(m.head_dim);
    if stated != inner {
        bail!(
            "config.json: the Mamba2 inner size is {stated} ({expand_key} {expand} x hidden_size \
             {hidden}), but {} heads x head dim {} make {inner}; check the config's Mamba2 keys",
            m.heads,
            m.head_dim
        );
    }
    Ok(())
}

/// Qwen3-Next's and Qwen3.5's Gated `DeltaNet` layer.
pub fn gated_deltanet(c: &Config) -> PlanResult<Layer> {
    let what = "a linear-attention (Gated DeltaNet) layer";
    Ok(Layer::GatedDeltaNet(GatedDeltaNetShape {
        key_heads: c.require(&["linear_num_key_heads"], what)?,
        value_heads: c.require(&["linear_num_value_heads"], what)?,
        key_head_dim: c.require(&["linear_key_head_dim"], what)?,
        value_head_dim: c.require(&["linear_value_head_dim"], what)?,
        conv_kernel: c.require(&["linear_conv_kernel_dim"], what)?,
    }))
}

/// One layer a pattern position, each kind read once: `kind_of` maps a position to a kind's
/// index in `kinds`, whose readers run only for kinds that occur.
pub fn by_kind(
    count: u64,
    kinds: &[&dyn Fn() -> PlanResult<Layer>],
    kind_of: impl Fn(u64) -> PlanResult<usize>,
) -> PlanResult<Vec<Layer>> {
    let mut read: Vec<Option<Layer>> = vec![None; kinds.len()];
    (0..count)
        .map(|i| {
            let k = kind_of(i)?;
            let Some(reader) = kinds.get(k) else {
                bail!("layer {i}: no reader for kind {k} (a bug in pdplan)");
            };
            if let Some(layer) = read[k] {
                return Ok(layer);
            }
            let layer = reader()?;
            read[k] = Some(layer);
            Ok(layer)
        })
        .collect()
}

/// Every layer alike.
pub fn uniform(count: u64, layer: Layer) -> Vec<Layer> {
    (0..count).map(|_| layer).collect()
}

/// The layer-kind names transformers 5 writes for older ones when it loads a config (and so
/// when it saves one again): `_LEGACY_LAYER_TYPE_REMAP` in transformers'
/// `configuration_utils.py`, applied to every config's `layer_types`. vLLM's models read
/// whichever name the file holds, so a reader knowing one name knows both.
const LEGACY_LAYER_TYPES: &[(&str, &str)] = &[
    ("mamba", "linear_attention"),
    ("attention", "full_attention"),
    ("deepseek_sparse_attention", "indexed_attention"),
    ("qwen_sparse_attention", "indexed_attention"),
];

/// A layer-kind name as transformers 5 writes it (`LEGACY_LAYER_TYPES`).
fn current_layer_type(name: &str) -> &str {
    LEGACY_LAYER_TYPES
        .iter()
        .find(|(old, _)| *old == name)
        .map_or(name, |(_, new)| new)
}

/// A list of layer-kind names (`layer_types`), each mapped by `names` to a kind index; a
/// name and the one transformers 5 writes for it (`LEGACY_LAYER_TYPES`) are one kind.
pub fn named_kinds<'a>(
    key: &str,
    list: &'a [Value],
    names: &[(&str, usize)],
) -> impl Fn(u64) -> PlanResult<usize> + 'a {
    let names: Vec<(String, usize)> = names.iter().map(|(n, k)| ((*n).to_owned(), *k)).collect();
    let key = key.to_owned();
    move |i| {
        let value = usize::try_from(i)
            .ok()
            .and_then(|at| list.get(at))
            .ok_or_else(|| PlanError::new(format!("config.json: {key} has no layer {i}")))?;
        let name = current_layer_type(value.as_str().unwrap_or(""));
        names
            .iter()
            .find(|(n, _)| current_layer_type(n) == name)
            .map(|(_, k)| *k)
            .ok_or_else(|| {
                let known: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
                PlanError::new(format!(
                    "config.json: {key}[{i}] is {value}, a layer kind this family's reader does \
                     not know; it reads {}",
                    known.join(", ")
                ))
            })
    }
}
