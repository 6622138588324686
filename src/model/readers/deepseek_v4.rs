//! `DeepSeek`-V4 (vLLM `models/deepseek_v4/attention.py`, `DeepseekV4Attention.__init__`):
//! every layer keeps a sliding latent of `head_dim` (its `qk_rope_head_dim` rope dims) and
//! `sliding_window` tokens; layer `l` below `num_hidden_layers` compresses by
//! `max(1, compress_ratios[l])` (entries past the layers are the MTP modules'); at ratio 4
//! the indexer keeps keys of `index_head_dim`. The KV heads shape no cache (vLLM builds one
//! latent a token whatever `num_key_value_heads` says): read and set aside.

use super::super::config::{as_u64, Config};
use super::super::deepseek_v4::DeepseekV4Shape;
use super::super::layers::Layer;
use crate::error::{bail, PlanResult};

pub fn deepseek_v4(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let what = "a DeepSeek-V4 layer";
    let _ = c.u64("num_key_value_heads")?;
    let head_dim = c.require(&["head_dim"], what)?;
    let rope_head_dim = c.require(&["qk_rope_head_dim"], what)?;
    let sliding_window = c.require(&["sliding_window"], what)?;
    let index_head_dim = c.u64("index_head_dim")?.unwrap_or(0);
    let Some(ratios) = c.list("compress_ratios")? else {
        bail!("config.json: a DeepSeek-V4 config lists compress_ratios, one a layer (0: none)");
    };
    if (ratios.len() as u64) < count {
        bail!(
            "config.json: compress_ratios lists {} layers but the model has {count}",
            ratios.len()
        );
    }
    ratios
        .iter()
        .take(usize::try_from(count).unwrap_or(usize::MAX))
        .map(|value| {
            let compress_ratio = as_u64(value, "compress_ratios")?.max(1);
            Ok(Layer::DeepseekV4(DeepseekV4Shape {
                head_dim,
                rope_head_dim,
                sliding_window,
                compress_ratio,
                index_head_dim: if compress_ratio == 4 {
                    index_head_dim
                } else {
                    0
                },
            }))
        })
        .collect()
}
