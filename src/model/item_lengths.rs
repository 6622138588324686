//! Buffer layouts inferred from the byte lengths a runtime knows of each buffer.

use crate::error::{bail, PlanError, PlanResult};
use crate::layout::{BufferKind, BufferLayout, LogicalAxis, LogicalParts, TokenPieces};
use crate::limits;

/// What a runtime knows of one buffer: its per-rank item length on each side and the length
/// of one logical unit (a head, a channel) in a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemLengths {
    pub buffer_index: u64,
    pub buffer_kind: BufferKind,
    pub prefill_item_bytes: u64,
    pub decode_item_bytes: u64,
    pub unit_bytes: u64,
    pub page_size: u64,
    /// Logical units in the whole buffer (e.g. the KV heads), when known; disambiguates
    /// replica groups on both sides.
    pub logical_size: Option<u64>,
    /// Rows a page on both sides (`page_size` for token-major pages).
    pub rows_per_page: u64,
}

/// The units of one item on each side (prefill, decode): whole numbers of positive units.
fn unit_counts(item: &ItemLengths, name: &str) -> PlanResult<[u64; 2]> {
    if item.unit_bytes == 0 {
        bail!("{name}: unit_bytes must be positive");
    }
    let mut units = [0; 2];
    let sides = [
        ("prefill", item.prefill_item_bytes),
        ("decode", item.decode_item_bytes),
    ];
    for (count, (side, bytes)) in units.iter_mut().zip(sides) {
        if bytes == 0 || bytes % item.unit_bytes != 0 {
            bail!(
                "{name}: the {side} item of {bytes} bytes is not a whole number of {}-byte units",
                item.unit_bytes
            );
        }
        *count = bytes / item.unit_bytes;
    }
    Ok(units)
}

/// Infers both sides' layouts of one buffer from its byte lengths: equal global units means
/// sharded; equal items on both sides means replicated; more units on one side than the
/// other means that side's TP runs above the logical size, in replica groups.
pub fn from_item_lengths(
    item: &ItemLengths,
    prefill_tp: u64,
    decode_tp: u64,
) -> PlanResult<(BufferLayout, BufferLayout)> {
    let name = format!(
        "buffer {} ({})",
        item.buffer_index,
        item.buffer_kind.as_str()
    );
    let [prefill_units, decode_units] = unit_counts(item, &name)?;
    for (what, tp) in [("prefill_tp", prefill_tp), ("decode_tp", decode_tp)] {
        limits::WORLD_SIZE
            .check(what, tp)
            .map_err(|e| PlanError::new(format!("{name}: {e}")))?;
    }
    let prefill_global = prefill_units.checked_mul(prefill_tp);
    let decode_global = decode_units.checked_mul(decode_tp);
    let (Some(prefill_global), Some(decode_global)) = (prefill_global, decode_global) else {
        bail!("{name}: item lengths overflow");
    };
    let side = |logical_axis, logical_size, item_bytes, replica| BufferLayout {
        buffer_index: item.buffer_index,
        buffer_kind: item.buffer_kind,
        logical_axis,
        logical_size,
        page_size: item.page_size.max(1),
        bytes_per_logical_unit: item.unit_bytes,
        item_stride_bytes: item_bytes,
        tp_replica_group_size: replica,
        layer: None,
        rows_per_page: item.rows_per_page,
        page_bytes: None,
        logical_parts: LogicalParts::WHOLE,
        sliding_window: None,
        attention_chunk_size: None,
        token_pieces: TokenPieces::NONE,
    };
    let axis = if item.buffer_kind == BufferKind::MambaState {
        LogicalAxis::StateChannel
    } else {
        LogicalAxis::KvHead
    };
    let replica = |logical: u64, global: u64, units: u64, tp: u64| -> Option<u64> {
        // `tp / replica` shards of `units` units each must make `logical` units.
        (logical > 0 && global % logical == 0)
            .then(|| global / logical)
            .filter(|r| *r >= 1 && tp % r == 0 && units.checked_mul(tp / r) == Some(logical))
    };
    let sharded = |logical: u64| {
        Some((
            replica(logical, prefill_global, prefill_units, prefill_tp)?,
            replica(logical, decode_global, decode_units, decode_tp)?,
        ))
    };
    let split = |logical: u64, (pr, dr): (u64, u64)| {
        (
            side(axis, logical, item.prefill_item_bytes, pr),
            side(axis, logical, item.decode_item_bytes, dr),
        )
    };
    let refuse = || {
        PlanError::new(format!(
            "{name}: prefill TP {prefill_tp} x {prefill_units} units and decode TP {decode_tp} \
             x {decode_units} units describe neither the same sharded buffer ({prefill_global} \
             vs {decode_global} units) nor a replicated one (items of {} vs {} bytes); check \
             the item lengths, or pass the buffer's logical size",
            item.prefill_item_bytes, item.decode_item_bytes
        ))
    };
    let out = if let Some(logical) = item.logical_size {
        // Known logical size: only replica groups can explain a difference.
        split(logical, sharded(logical).ok_or_else(refuse)?)
    } else if prefill_global == decode_global {
        split(prefill_global, (1, 1))
    } else if item.prefill_item_bytes == item.decode_item_bytes {
        (
            side(
                LogicalAxis::Replicated,
                prefill_units,
                item.prefill_item_bytes,
                1,
            ),
            side(
                LogicalAxis::Replicated,
                decode_units,
                item.decode_item_bytes,
                1,
            ),
        )
    } else {
        // The side with more global units runs its TP above the logical size.
        let logical = prefill_global.min(decode_global);
        split(logical, sharded(logical).ok_or_else(refuse)?)
    };
    out.0.validate()?;
    out.1.validate()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_lengths_infer_sharding_replication_and_replicas() {
        let item = |p, d, logical| ItemLengths {
            buffer_index: 0,
            buffer_kind: BufferKind::TargetK,
            prefill_item_bytes: p,
            decode_item_bytes: d,
            unit_bytes: 100,
            page_size: 16,
            logical_size: logical,
            rows_per_page: 1,
        };
        let (p, d) = from_item_lengths(&item(100, 400, None), 8, 2).unwrap();
        assert_eq!(
            (p.logical_axis, p.logical_size, d.logical_size),
            (LogicalAxis::KvHead, 8, 8)
        );
        let (p, _) = from_item_lengths(&item(100, 200, None), 4, 1).unwrap();
        assert_eq!((p.logical_size, p.tp_replica_group_size), (2, 2));
        let (p, d) = from_item_lengths(&item(100, 100, Some(2)), 8, 4).unwrap();
        assert_eq!((p.tp_replica_group_size, d.tp_replica_group_size), (4, 2));
        let (p, _) = from_item_lengths(&item(300, 300, None), 4, 2).unwrap();
        assert_eq!(p.logical_axis, LogicalAxis::Replicated);
        assert!(from_item_lengths(&item(100, 300, None), 4, 2).is_err());
        assert!(from_item_lengths(&item(150, 400, None), 8, 2).is_err());
    }
}
