//! Whether a prefill buffer list and a decode buffer list describe the same buffers, and
//! whether each side's TP size can shard them: the rules a pair must meet before it is planned.

use crate::error::{bail, PlanResult};
use crate::layout::{check_distinct_indexes, BufferLayout, LogicalAxis, ParallelLayout};
use crate::page::TokenGeometry;

/// One buffer position of a pair, whose fields must agree on both sides.
struct Same {
    position: usize,
}

impl Same {
    fn check<T: PartialEq + std::fmt::Debug + Copy>(
        &self,
        what: &str,
        p: T,
        d: T,
    ) -> PlanResult<()> {
        if p != d {
            bail!(
                "prefill/decode {what} differ at buffer position {}: prefill {p:?}, decode \
                 {d:?}; both sides must describe the same buffers in the same order",
                self.position
            );
        }
        Ok(())
    }
}

/// A buffer not indexed by token (a state, vLLM's CPU cache) moves whole pages: both sides'
/// pages must hold as many tokens (the CPU cache's K is transposed inside a block, so a token
/// has no place of its own) and the same rows (a conv state's taps).
fn check_whole_pages(p: &BufferLayout, d: &BufferLayout) -> PlanResult<()> {
    if p.logical_axis.is_token_indexed() {
        return Ok(());
    }
    if p.page_size != d.page_size && p.page_size.max(d.page_size) > 1 {
        bail!(
            "buffer {} moves whole pages (its tokens have no place of their own in a page), but \
             a prefill page holds {} tokens and a decode page {}: give both sides the same \
             block size",
            p.buffer_index,
            p.page_size,
            d.page_size
        );
    }
    if p.rows_per_page != d.rows_per_page {
        bail!(
            "buffer {} is a state whose rows differ: prefill {}, decode {} (a conv state's rows \
             are its kernel taps, plus one a speculative token, where they sit outside its \
             channels); run both sides with the same conv layout (dim-first or not), conv \
             kernel and num_speculative_tokens",
            p.buffer_index,
            p.rows_per_page,
            d.rows_per_page
        );
    }
    Ok(())
}

/// Whether a pair must be planned by token: a token-indexed buffer whose two sides' pages do
/// not pair (different token counts, or head-major facing token-major) cannot be copied page
/// to page, and a sliding window or an attention chunk is a selection of tokens.
pub fn needs_token_maps(prefill: &[BufferLayout], decode: &[BufferLayout]) -> bool {
    prefill.iter().zip(decode).any(|(p, d)| {
        p.logical_axis.is_token_indexed()
            && (!p.pages_pair(d) || p.sliding_window.is_some() || p.attention_chunk_size.is_some())
    })
}

/// With token maps, a token-indexed buffer has a token geometry on both sides, and one token
/// of one unit takes the same bytes, in the same planes, on both (page sizes may differ).
fn check_token_geometry(position: usize, p: &BufferLayout, d: &BufferLayout) -> PlanResult<()> {
    let (src, dst) = (TokenGeometry::of(p)?, TokenGeometry::of(d)?);
    // Token runs need the same planes; with one plane, head-major and token-major pages may
    // even face each other (a run per unit and token).
    if src.planes != dst.planes {
        bail!(
            "prefill/decode pages are stored differently at buffer position {position}: prefill \
             rows_per_page={} page_size={}, decode rows_per_page={} page_size={}; both sides \
             must hold each token in the same number of planes (rows_per_page = planes x \
             page_size; head-major pages, rows_per_page=1, have one)",
            p.rows_per_page,
            p.page_size,
            d.rows_per_page,
            d.page_size
        );
    }
    if p.token_pieces != d.token_pieces {
        bail!(
            "prefill/decode units hold their tokens differently at buffer position {position}: \
             token_pieces {:?} there, {:?} here; both sides must lay a unit's tokens out alike \
             (the same backend)",
            p.token_pieces.given(),
            d.token_pieces.given()
        );
    }
    if src.unit_bytes != dst.unit_bytes {
        bail!(
            "prefill/decode bytes of one token differ at buffer position {position}: prefill \
             {} bytes a unit and token ({} bytes a unit over {} tokens), decode {} ({} over \
             {}); pages of different sizes must hold tokens of the same size",
            src.token_bytes(),
            p.bytes_per_logical_unit,
            p.page_size,
            dst.token_bytes(),
            d.bytes_per_logical_unit,
            d.page_size
        );
    }
    Ok(())
}

/// A state's channel is the same size on both sides; where it is not, the likely cause named:
/// a dim-first conv state's channel holds its kernel's taps, one more a speculative token.
fn check_state_channels(position: usize, p: &BufferLayout, d: &BufferLayout) -> PlanResult<()> {
    if p.logical_axis != LogicalAxis::StateChannel
        || p.bytes_per_logical_unit == d.bytes_per_logical_unit
    {
        return Ok(());
    }
    bail!(
        "state buffer {} (position {position}) holds channels of {} bytes on the prefill side \
         and {} on the decode side. A conv state stored dim-first keeps each channel's kernel \
         taps together (conv_kernel - 1 of them, plus one a speculative token), so its taps \
         differ: run both sides with the same conv kernel, num_speculative_tokens and state \
         dtypes",
        p.buffer_index,
        p.bytes_per_logical_unit,
        d.bytes_per_logical_unit
    );
}

/// Both sides list the same buffers, in the same order, stored the same way; with
/// `token_maps`, token by token (page sizes and rows may differ).
pub fn validate_pairs(
    prefill: &[BufferLayout],
    decode: &[BufferLayout],
    token_maps: bool,
) -> PlanResult<()> {
    if prefill.len() != decode.len() {
        bail!(
            "prefill/decode buffer counts differ: {} prefill buffers, {} decode buffers; pass \
             one decode buffer for each prefill buffer, in the same order",
            prefill.len(),
            decode.len()
        );
    }
    check_distinct_indexes(prefill)?;
    check_distinct_indexes(decode)?;
    for (position, (p, d)) in prefill.iter().zip(decode).enumerate() {
        let same = Same { position };
        same.check("buffer indexes", p.buffer_index, d.buffer_index)?;
        same.check(
            "buffer kinds",
            p.buffer_kind.as_str(),
            d.buffer_kind.as_str(),
        )?;
        same.check(
            "logical axes",
            p.logical_axis.as_str(),
            d.logical_axis.as_str(),
        )?;
        same.check("logical sizes", p.logical_size, d.logical_size)?;
        check_whole_pages(p, d)?;
        // Where both sides name a buffer's model layer, it is the same layer: a runtime that
        // handed its layers over in another order must not pair layer 4 with layer 1.
        if let (Some(_), Some(_)) = (p.layer, d.layer) {
            same.check("model layers", p.layer, d.layer)?;
        }
        same.check(
            "logical parts",
            p.logical_parts.given(),
            d.logical_parts.given(),
        )?;
        same.check(
            "logical part groups",
            p.logical_parts.groups(),
            d.logical_parts.groups(),
        )?;
        same.check("sliding windows", p.sliding_window, d.sliding_window)?;
        same.check(
            "attention chunks",
            p.attention_chunk_size,
            d.attention_chunk_size,
        )?;
        if token_maps && p.logical_axis.is_token_indexed() {
            check_token_geometry(position, p, d)?;
            if !p.pages_pair(d) {
                // Token by token: whole units, rows and items need not agree.
                continue;
            }
        }
        check_state_channels(position, p, d)?;
        same.check(
            "logical unit sizes",
            p.bytes_per_logical_unit,
            d.bytes_per_logical_unit,
        )?;
        if p.rows_per_page != d.rows_per_page {
            bail!(
                "prefill/decode rows_per_page differ at buffer position {position}: prefill {}, \
                 decode {}; both sides must store pages the same way (both head-major or both \
                 token-major)",
                p.rows_per_page,
                d.rows_per_page
            );
        }
        let replicated = p.logical_axis == LogicalAxis::Replicated;
        if replicated && p.rows_per_page > 1 && p.page_extent() != d.page_extent() {
            bail!(
                "replicated buffer {} ({}) has {} rows a page but items of {} (prefill) and {} \
                 (decode) bytes: whole items are copied byte for byte, so token-major replicated \
                 items must be the same size on both sides",
                p.buffer_index,
                p.buffer_kind.as_str(),
                p.rows_per_page,
                p.page_extent(),
                d.page_extent()
            );
        }
        if replicated && d.page_extent() > p.page_extent() {
            bail!(
                "replicated buffer {} ({}): the decode item ({} bytes) is larger than the \
                 prefill item ({} bytes), so copying it would read past the prefill item; \
                 make the decode item_stride_bytes at most the prefill one",
                p.buffer_index,
                p.buffer_kind.as_str(),
                d.page_extent(),
                p.page_extent()
            );
        }
    }
    Ok(())
}

/// One side's TP size (and replica groups) shard `buffer` evenly, and its item holds a shard.
pub fn validate_alignment(layout: &ParallelLayout, buffer: &BufferLayout) -> PlanResult<()> {
    if !buffer.logical_axis.is_sharded() {
        return Ok(());
    }
    let role = layout.role().as_str();
    let kind = buffer.buffer_kind.as_str();
    let tp = layout.ranks().tp_size();
    let replica = buffer.tp_replica_group_size;
    if tp % replica != 0 {
        bail!(
            "tp replica group must divide TP size for buffer_kind={kind} on the {role} side: \
             tp_size_per_dp={tp}, tp_replica_group_size={replica}"
        );
    }
    let effective_tp = tp / replica;
    if let Err(why) = buffer
        .logical_parts
        .check_cuts(buffer.logical_size, effective_tp)
    {
        bail!(
            "non-aligned TP heterogeneous mapping for buffer_kind={kind} on the {role} side: \
             {why} (tp_size_per_dp={tp} / tp_replica_group_size={replica}); choose a TP size \
             whose shard count divides it, or a replica group that makes it so"
        );
    }
    let item_units = buffer.page_extent() / buffer.bytes_per_logical_unit;
    let required_units = buffer
        .logical_parts
        .shard_units(buffer.logical_size, effective_tp);
    if item_units < required_units {
        bail!(
            "buffer item is smaller than its logical shard for buffer_kind={kind} on the \
             {role} side: item_units={item_units}, required_units={required_units}; \
             item_stride_bytes must be at least {} bytes",
            required_units * buffer.bytes_per_logical_unit
        );
    }
    Ok(())
}

/// A side that spreads tokens over ranks can hold `buffer`: DCP ranks share a replica group's
/// heads (so `dcp_size` divides the group), and state, one value a request, is not dealt.
pub fn validate_context(layout: &ParallelLayout, buffer: &BufferLayout) -> PlanResult<()> {
    let context = layout.context();
    if !context.is_active() {
        return Ok(());
    }
    let role = layout.role().as_str();
    let kind = buffer.buffer_kind.as_str();
    if !buffer.logical_axis.is_token_indexed() {
        bail!(
            "buffer {} ({kind}) is state (state_channel), but the {role} side runs context \
             parallelism (cp_size={}, dcp_size={}); state with CP is not supported: plan the \
             state buffers with a layout without CP, or leave them out",
            buffer.buffer_index,
            context.cp_size,
            context.dcp_size
        );
    }
    let dcp = context.dcp_size;
    let replica = buffer.tp_replica_group_size;
    if buffer.logical_axis == LogicalAxis::KvHead && replica % dcp != 0 {
        bail!(
            "dcp_size={dcp} must divide the {role} side's replica group of buffer {} ({kind}): \
             tp_replica_group_size={replica} ranks hold the same KV heads, and DCP splits their \
             tokens instead of copying them; choose a dcp_size that divides {replica}",
            buffer.buffer_index
        );
    }
    Ok(())
}
