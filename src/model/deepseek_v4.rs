//! `DeepSeek`-V4's attention caches, as vLLM 0.32 allocates them: up to five a layer, each
//! paged at a block size of its own and each page padded to an alignment.
//!
//! Per layer, in order (vLLM `models/deepseek_v4/attention.py`, `compressor.py`,
//! `v1/attention/backends/mla/sparse_swa.py`; sizes from `v1/kv_cache_interface.py`):
//! 1. the sliding-window latent (`DeepseekV4SWACache`): one latent a token, 64-token pages,
//!    the layer's `sliding_window`;
//! 2. with `compress_ratio` r > 1, the compressed latent (`DeepseekV4Attention`): one entry
//!    per r tokens, pages of the cache's 256-token blocks, so `256 / r` entries a page;
//! 3. with r > 1, the compressor's state (`CompressorStateCache`): fp32 rows of
//!    `2 * coff * head_dim` a token (coff 2 at r = 4, else 1), pages of 4 tokens at r = 4 and
//!    8 at r = 128, a window of `coff * r` tokens;
//! 4. at r = 4, the indexer's keys (`DeepseekV4IndexerCache`): one fp8 key of
//!    `index_head_dim` bytes and a 4-byte scale per 128 a compressed entry, 64 entries a page;
//! 5. at r = 4, the indexer's compressor state, as 3 with `index_head_dim`.
//!
//! A compressed cache's buffer counts entries, not tokens: its `page_size` is the entries a
//! page holds, and a request's slot maps for it are the runtime's compressed slot mapping.
//! Latents are `FlashMLA`'s `fp8_ds_mla` rows with an fp8 cache (584 bytes: 448 fp8 values,
//! 64 bf16 rope values, 8 scale bytes; pages padded to 576 bytes), or plain bf16 rows (pages
//! padded to 512). Every cache is one replicated unit (vLLM: one KV head, `max_tp_shards=1`).

use super::dtype::Dtype;
use crate::error::{bail, PlanError, PlanResult};
use crate::layout::{BufferKind, BufferLayout, LogicalAxis, LogicalParts, TokenPieces};
use crate::limits::MAX_VALUE;

/// One `DeepSeek`-V4 attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeepseekV4Shape {
    /// The latent's dim (512), K and V in one.
    pub head_dim: u64,
    /// Its rope part's dim (64).
    pub rope_head_dim: u64,
    /// Tokens the sliding-window latent keeps.
    pub sliding_window: u64,
    /// Tokens a compressed entry covers: 1 (none), 4 or 128.
    pub compress_ratio: u64,
    /// The indexer's key dim, used at ratio 4 only.
    pub index_head_dim: u64,
}

/// Tokens of one block of the compressed caches: the only block size vLLM's sparse MLA kernel
/// takes (`sparse_mla.py`, `get_supported_kernel_block_sizes`).
pub const COMPRESSED_BLOCK_TOKENS: u64 = 256;
/// Tokens a page of the sliding-window latent (`DeepseekV4SWACache`'s `block_size`).
const SWA_PAGE_TOKENS: u64 = 64;
/// `fp8_ds_mla`'s bytes a latent (`sparse_swa.py`'s `packed_bytes_per_token`), for a latent of
/// `FP8_DS_MLA_DIMS`.
const FP8_DS_MLA_BYTES: u64 = 584;
const FP8_DS_MLA_DIMS: (u64, u64) = (512, 64);
/// Page alignment of `fp8_ds_mla` caches (`FlashMLA`'s stride) and of plain rows.
const FP8_DS_MLA_ALIGN: u64 = 576;
const PLAIN_ALIGN: u64 = 512;
/// Keys an indexer scale covers, and its bytes.
const INDEX_SCALE_KEYS: u64 = 128;

/// The five caches' roles, in buffer order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    SlidingLatent,
    CompressedLatent,
    CompressorState,
    IndexerKeys,
    IndexerCompressorState,
}

/// One cache: its role, items a page, content bytes an item, and its window in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct V4Cache {
    pub role: Role,
    pub page_items: u64,
    pub item_bytes: u64,
    pub window: Option<u64>,
    /// Bytes between pages: the content rounded up to the alignment.
    pub page_stride: u64,
}

fn checked(values: &[u64]) -> PlanResult<u64> {
    values
        .iter()
        .try_fold(1u64, |acc, &v| acc.checked_mul(v))
        .filter(|&v| v <= MAX_VALUE)
        .ok_or_else(|| PlanError::new("a DeepSeek-V4 cache overflows 2^63 bytes"))
}

fn cache_of(
    role: Role,
    page_items: u64,
    item_bytes: u64,
    window: Option<u64>,
    align: u64,
) -> PlanResult<V4Cache> {
    let content = checked(&[page_items, item_bytes])?;
    let page_stride = content
        .div_ceil(align)
        .checked_mul(align)
        .filter(|&v| v <= MAX_VALUE)
        .ok_or_else(|| PlanError::new("a DeepSeek-V4 cache overflows 2^63 bytes"))?;
    Ok(V4Cache {
        role,
        page_items,
        item_bytes,
        window,
        page_stride,
    })
}

impl DeepseekV4Shape {
    /// The layer's caches (the same on every rank) with a `kv` cache dtype and pages of
    /// `page_size` tokens, in buffer order.
    pub fn caches(&self, kv: Dtype, page_size: u64) -> PlanResult<Vec<V4Cache>> {
        let what = "the DeepSeek-V4 attention caches";
        if page_size != COMPRESSED_BLOCK_TOKENS {
            bail!(
                "{what}: vLLM pages DeepSeek-V4 at {COMPRESSED_BLOCK_TOKENS} tokens a block (its \
                 sparse MLA kernel's only block size), got page_size={page_size}; use \
                 page_size={COMPRESSED_BLOCK_TOKENS}"
            );
        }
        if !matches!(self.compress_ratio, 1 | 4 | 128) {
            bail!(
                "{what}: compress_ratio={} is not one vLLM builds (0 or 1: none, 4, 128)",
                self.compress_ratio
            );
        }
        if self.sliding_window == 0 {
            bail!("{what}: sliding_window must be positive");
        }
        let (latent, align) = if kv.is_fp8() {
            if (self.head_dim, self.rope_head_dim) != FP8_DS_MLA_DIMS {
                bail!(
                    "{what}: vLLM's fp8_ds_mla layout is written for a {}-dim latent with {} rope \
                     dims, got head_dim={} and qk_rope_head_dim={}",
                    FP8_DS_MLA_DIMS.0,
                    FP8_DS_MLA_DIMS.1,
                    self.head_dim,
                    self.rope_head_dim
                );
            }
            (FP8_DS_MLA_BYTES, FP8_DS_MLA_ALIGN)
        } else if kv == Dtype::BFloat16 {
            (Dtype::BFloat16.bytes_of(self.head_dim, what)?, PLAIN_ALIGN)
        } else {
            bail!(
                "{what}: vLLM keeps DeepSeek-V4's latents as fp8 (fp8_ds_mla, its default) or \
                 bfloat16 rows, not {}; use one of those kv_cache_dtypes",
                kv.as_str()
            );
        };
        if self.head_dim == 0 {
            bail!("{what}: head_dim must be positive");
        }
        let ratio = self.compress_ratio;
        let mut out = vec![cache_of(
            Role::SlidingLatent,
            SWA_PAGE_TOKENS,
            latent,
            Some(self.sliding_window),
            align,
        )?];
        if ratio == 1 {
            return Ok(out);
        }
        let coff = if ratio == 4 { 2 } else { 1 };
        let (state_page, state_window) = (if ratio == 4 { 4 } else { 8 }, coff * ratio);
        // fp32 kv and score rows of `coff * dim` each, a token.
        let state_bytes = |dim: u64| checked(&[2, coff, dim, 4]);
        out.push(cache_of(
            Role::CompressedLatent,
            COMPRESSED_BLOCK_TOKENS / ratio,
            latent,
            None,
            align,
        )?);
        out.push(cache_of(
            Role::CompressorState,
            state_page,
            state_bytes(self.head_dim)?,
            Some(state_window),
            align,
        )?);
        if ratio == 4 {
            if self.index_head_dim == 0 || self.index_head_dim % INDEX_SCALE_KEYS != 0 {
                bail!(
                    "{what}: index_head_dim={} must be a positive multiple of the indexer's \
                     {INDEX_SCALE_KEYS}-key scale blocks",
                    self.index_head_dim
                );
            }
            let keys = self.index_head_dim + self.index_head_dim / INDEX_SCALE_KEYS * 4;
            out.push(cache_of(
                Role::IndexerKeys,
                COMPRESSED_BLOCK_TOKENS / ratio,
                keys,
                None,
                align,
            )?);
            out.push(cache_of(
                Role::IndexerCompressorState,
                state_page,
                state_bytes(self.index_head_dim)?,
                Some(state_window),
                align,
            )?);
        }
        Ok(out)
    }

    /// Appends the layer's buffers on one rank.
    pub fn buffers(
        &self,
        kv: Dtype,
        page_size: u64,
        out: &mut Vec<BufferLayout>,
    ) -> PlanResult<()> {
        for c in self.caches(kv, page_size)? {
            let content = checked(&[c.page_items, c.item_bytes])?;
            out.push(BufferLayout {
                buffer_index: 0,
                buffer_kind: BufferKind::TargetK,
                logical_axis: LogicalAxis::Replicated,
                logical_size: 1,
                page_size: c.page_items,
                bytes_per_logical_unit: content,
                item_stride_bytes: c.page_stride,
                tp_replica_group_size: 1,
                layer: None,
                rows_per_page: 1,
                page_bytes: (content < c.page_stride).then_some(content),
                logical_parts: LogicalParts::WHOLE,
                sliding_window: c.window,
                attention_chunk_size: None,
                token_pieces: TokenPieces::NONE,
            });
        }
        Ok(())
    }

    pub fn label(&self) -> String {
        let compressed = match self.compress_ratio {
            1 => String::new(),
            4 => "; compressed 1 entry per 4 tokens + indexer".to_owned(),
            r => format!("; compressed 1 entry per {r} tokens"),
        };
        format!(
            "DeepSeek-V4 attention (window {}{compressed})",
            self.sliding_window
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(ratio: u64) -> DeepseekV4Shape {
        DeepseekV4Shape {
            head_dim: 512,
            rope_head_dim: 64,
            sliding_window: 128,
            compress_ratio: ratio,
            index_head_dim: 128,
        }
    }

    #[test]
    fn page_strides_round_each_cache_up_to_its_alignment() {
        // (items a page, content bytes an item, page stride): 584 x 64 = 37,376 -> 37,440.
        let got = |ratio, kv| -> Vec<(u64, u64, u64)> {
            layer(ratio)
                .caches(kv, 256)
                .unwrap()
                .iter()
                .map(|c| (c.page_items, c.item_bytes, c.page_stride))
                .collect()
        };
        assert_eq!(got(1, Dtype::Float8E4M3Fn), vec![(64, 584, 37_440)]);
        assert_eq!(
            got(128, Dtype::Float8E4M3Fn),
            vec![(64, 584, 37_440), (2, 584, 1_728), (8, 4_096, 32_832)]
        );
        assert_eq!(
            got(4, Dtype::BFloat16),
            vec![
                (64, 1_024, 65_536),
                (64, 1_024, 65_536),
                (4, 8_192, 32_768),
                (64, 132, 8_704),
                (4, 2_048, 8_192)
            ]
        );
    }

    #[test]
    fn other_page_sizes_ratios_and_dtypes_are_refused_by_name() {
        let err = layer(4).caches(Dtype::Float8E4M3Fn, 16).unwrap_err();
        assert!(err.message().contains("page_size=256"), "{err}");
        let err = layer(8).caches(Dtype::Float8E4M3Fn, 256).unwrap_err();
        assert!(err.message().contains("compress_ratio=8"), "{err}");
        let err = layer(4).caches(Dtype::Float16, 256).unwrap_err();
        assert!(err.message().contains("float16"), "{err}");
        let odd = DeepseekV4Shape {
            head_dim: 576,
            ..layer(4)
        };
        assert!(odd.caches(Dtype::Float8E4M3Fn, 256).is_err());
    }
}
