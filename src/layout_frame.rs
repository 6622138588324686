//! Layouts exchanged once: one side's parallel layout and buffers (and, optionally, one rank's
//! base addresses and limits) as a versioned frame pair, so that a peer builds the same
//! planner locally and requests need only their pages or slot maps. Decoding is bounded and
//! strict, like fragment frames: the frame comes from another process.
//!
//! Also the planner's fingerprint, equal on both sides exactly when they plan alike, and the
//! first field in which a peer's layout differs from the one expected.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::context::{CpKv, CpSplit};
use crate::error::{bail, PlanError, PlanResult};
use crate::fragment::LATEST_VERSION;
use crate::json_refusal;
use crate::layout::{
    check_distinct_indexes, BufferKind, BufferLayout, ContextParallel, IndexSpace, LogicalAxis,
    LogicalParts, ParallelLayout, Role, TokenPieces,
};
use crate::limits;
use crate::planner::{Planner, PLANNING_RULES_VERSION};

/// The layout frame's version, as its version frame spells it.
pub const LAYOUT_VERSION_FRAME: &[u8] = b"layout/1";

/// Most bytes a layout payload may hold before anything is parsed (1 MiB: some 3,000 buffers).
pub use crate::limits::DEFAULT_MAX_LAYOUT_BYTES;

/// One side as a frame holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutFrame {
    pub layout: ParallelLayout,
    pub buffers: Vec<BufferLayout>,
    pub base_ptrs: Option<Vec<u64>>,
    pub limits: Option<Vec<u64>>,
}

fn push_optional(out: &mut String, value: Option<u64>) {
    match value {
        Some(v) => out.push_str(&v.to_string()),
        None => out.push_str("null"),
    }
}

fn push_list(out: &mut String, values: Option<&[u64]>) {
    let Some(values) = values else {
        out.push_str("null");
        return;
    };
    out.push('[');
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&v.to_string());
    }
    out.push(']');
}

/// The layout's fields as the frame writes them, in `ParallelLayout`'s dataclass order.
fn write_layout(out: &mut String, layout: &ParallelLayout) {
    let c = layout.context();
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "\"role\":\"{}\",\"world_size\":{},\"dp_size\":{},\"pp_size\":{},\
         \"pp_layer_partition\":",
        layout.role().as_str(),
        layout.world_size(),
        layout.dp_size(),
        layout.pp_size()
    );
    push_list(out, layout.pp_layer_partition());
    let _ = write!(
        out,
        ",\"cp_size\":{},\"dcp_size\":{},\"cp_kv\":\"{}\",\"cp_split\":\"{}\",\
         \"cp_interleave\":{}",
        c.cp_size,
        c.dcp_size,
        c.kv.as_str(),
        c.split.as_str(),
        c.interleave
    );
}

/// One buffer's fields, in `BufferLayout`'s dataclass order.
fn write_buffer(out: &mut String, b: &BufferLayout) {
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{{\"buffer_index\":{},\"buffer_kind\":\"{}\",\"logical_axis\":\"{}\",\
         \"logical_size\":{},\"page_size\":{},\"bytes_per_logical_unit\":{},\
         \"item_stride_bytes\":{},\"tp_replica_group_size\":{},\"rows_per_page\":{},\
         \"logical_parts\":",
        b.buffer_index,
        b.buffer_kind.as_str(),
        b.logical_axis.as_str(),
        b.logical_size,
        b.page_size,
        b.bytes_per_logical_unit,
        b.item_stride_bytes,
        b.tp_replica_group_size,
        b.rows_per_page
    );
    let parts = b.logical_parts.given();
    push_list(out, (!parts.is_empty()).then_some(parts));
    for (name, value) in [
        ("layer", b.layer),
        ("sliding_window", b.sliding_window),
        ("attention_chunk_size", b.attention_chunk_size),
        ("page_bytes", b.page_bytes),
    ] {
        // Writing to a String cannot fail.
        let _ = write!(out, ",\"{name}\":");
        push_optional(out, value);
    }
    // Written only where given: a layout without groups keeps the text (and fingerprint) it
    // had before parts could name them.
    let groups = b.logical_parts.groups();
    if !groups.is_empty() {
        out.push_str(",\"logical_part_groups\":");
        push_list(out, Some(groups));
    }
    let pieces = b.token_pieces.given();
    if !pieces.is_empty() {
        out.push_str(",\"token_pieces\":");
        push_list(out, Some(pieces));
    }
    out.push('}');
}

/// The canonical text of a side without addresses: what fingerprints hash.
fn side_text(layout: &ParallelLayout, buffers: &[BufferLayout]) -> String {
    let mut out = String::with_capacity(256 + buffers.len() * 320);
    out.push('{');
    write_layout(&mut out, layout);
    out.push_str(",\"buffers\":[");
    for (i, b) in buffers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_buffer(&mut out, b);
    }
    out.push(']');
    out
}

/// Encodes one side into (version frame, payload frame). Base pointers and limits, when given,
/// are one rank's and must name every buffer.
pub fn encode(
    layout: &ParallelLayout,
    buffers: &[BufferLayout],
    base_ptrs: Option<&[u64]>,
    limits: Option<&[u64]>,
) -> PlanResult<(Vec<u8>, Vec<u8>)> {
    check_buffers(buffers)?;
    check_addresses(buffers, base_ptrs, limits)?;
    let mut out = side_text(layout, buffers);
    out.push_str(",\"base_ptrs\":");
    push_list(&mut out, base_ptrs);
    out.push_str(",\"limits\":");
    push_list(&mut out, limits);
    out.push('}');
    Ok((LAYOUT_VERSION_FRAME.to_vec(), out.into_bytes()))
}

fn check_buffers(buffers: &[BufferLayout]) -> PlanResult<()> {
    limits::LAYOUT_BUFFERS.check("a layout's buffers", buffers.len() as u64)?;
    for b in buffers {
        b.validate()?;
    }
    check_distinct_indexes(buffers)
}

fn check_addresses(
    buffers: &[BufferLayout],
    bases: Option<&[u64]>,
    limits: Option<&[u64]>,
) -> PlanResult<()> {
    let count = buffers.len();
    if limits.is_some() && bases.is_none() {
        bail!("limits are given without base_ptrs; give both or neither");
    }
    // base_ptrs are read by buffer_index: an index a KV and a state buffer share reads two ways.
    let state: Vec<u64> = buffers
        .iter()
        .filter(|b| b.buffer_kind.index_space() == IndexSpace::State)
        .map(|b| b.buffer_index)
        .collect();
    let shared = buffers
        .iter()
        .find(|b| b.buffer_kind.index_space() == IndexSpace::Kv && state.contains(&b.buffer_index));
    if let (Some(b), Some(_)) = (shared, bases) {
        bail!(
            "a KV buffer and a state buffer both have buffer_index {}, and base_ptrs are read \
             by buffer_index: send the layout without base_ptrs, or number the side's buffers \
             once (the state buffers after the KV ones)",
            b.buffer_index
        );
    }
    for (name, column) in [("base_ptrs", bases), ("limits", limits)] {
        if let Some(column) = column.filter(|c| c.len() != count) {
            bail!(
                "{name} has {} entries for {count} buffers; give one for each buffer",
                column.len()
            );
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BufferWire {
    buffer_index: u64,
    buffer_kind: String,
    logical_axis: String,
    logical_size: u64,
    page_size: u64,
    bytes_per_logical_unit: u64,
    item_stride_bytes: u64,
    tp_replica_group_size: u64,
    rows_per_page: u64,
    logical_parts: Option<Vec<u64>>,
    layer: Option<u64>,
    sliding_window: Option<u64>,
    attention_chunk_size: Option<u64>,
    page_bytes: Option<u64>,
    #[serde(default)]
    logical_part_groups: Option<Vec<u64>>,
    #[serde(default)]
    token_pieces: Option<Vec<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutWire {
    role: String,
    world_size: u64,
    dp_size: u64,
    pp_size: u64,
    pp_layer_partition: Option<Vec<u64>>,
    cp_size: u64,
    dcp_size: u64,
    cp_kv: String,
    cp_split: String,
    cp_interleave: u64,
    buffers: Vec<BufferWire>,
    base_ptrs: Option<Vec<u64>>,
    limits: Option<Vec<u64>>,
}

impl BufferWire {
    fn into_buffer(self, position: usize) -> PlanResult<BufferLayout> {
        let parts = match (self.logical_parts, self.logical_part_groups) {
            (None, None) => LogicalParts::WHOLE,
            (Some(parts), None) => LogicalParts::new(&parts)?,
            (Some(parts), Some(groups)) => LogicalParts::new(&parts)?.with_groups(&groups)?,
            (None, Some(_)) => bail!(
                "layout buffer {position}: logical_part_groups names the groups of \
                 logical_parts, which it lacks"
            ),
        };
        let buffer = BufferLayout {
            buffer_index: self.buffer_index,
            buffer_kind: BufferKind::parse(&self.buffer_kind)?,
            logical_axis: LogicalAxis::parse(&self.logical_axis)?,
            logical_size: self.logical_size,
            page_size: self.page_size,
            bytes_per_logical_unit: self.bytes_per_logical_unit,
            item_stride_bytes: self.item_stride_bytes,
            tp_replica_group_size: self.tp_replica_group_size,
            layer: self.layer,
            rows_per_page: self.rows_per_page,
            page_bytes: self.page_bytes,
            logical_parts: parts,
            sliding_window: self.sliding_window,
            attention_chunk_size: self.attention_chunk_size,
            token_pieces: match self.token_pieces {
                None => TokenPieces::NONE,
                Some(pieces) => TokenPieces::new(&pieces)?,
            },
        };
        buffer
            .validate()
            .map_err(|e| PlanError::new(format!("layout buffer {position}: {e}")))?;
        Ok(buffer)
    }
}

/// Decodes a layout frame pair, refusing a payload past `max_payload_bytes` on its length.
pub fn decode(version: &[u8], payload: &[u8], max_payload_bytes: u64) -> PlanResult<LayoutFrame> {
    if version != LAYOUT_VERSION_FRAME {
        let shown = String::from_utf8_lossy(&version[..version.len().min(32)]).into_owned();
        bail!(
            "unsupported layout frame version {shown:?}: this build reads {:?}; upgrade the \
             peer or pdplan so both match",
            String::from_utf8_lossy(LAYOUT_VERSION_FRAME)
        );
    }
    if payload.len() as u64 > max_payload_bytes {
        bail!(
            "layout payload of {} bytes is over the limit of {max_payload_bytes} bytes; raise \
             max_payload_bytes if the layout really is this large",
            payload.len()
        );
    }
    let wire: LayoutWire = serde_json::from_slice(payload).map_err(|e| {
        PlanError::new(format!(
            "layout payload is not a valid layout: {}",
            json_refusal::describe(&e, payload)
        ))
    })?;
    limits::LAYOUT_BUFFERS.check("a layout's buffers", wire.buffers.len() as u64)?;
    let context = ContextParallel {
        cp_size: wire.cp_size,
        dcp_size: wire.dcp_size,
        kv: CpKv::parse(&wire.cp_kv)?,
        split: CpSplit::parse(&wire.cp_split)?,
        interleave: wire.cp_interleave,
    };
    let layout = ParallelLayout::with_context(
        Role::parse(&wire.role)?,
        (wire.world_size, wire.dp_size, wire.pp_size),
        wire.pp_layer_partition,
        context,
    )?;
    let buffers = wire
        .buffers
        .into_iter()
        .enumerate()
        .map(|(position, b)| b.into_buffer(position))
        .collect::<PlanResult<Vec<_>>>()?;
    check_distinct_indexes(&buffers)?;
    check_addresses(&buffers, wire.base_ptrs.as_deref(), wire.limits.as_deref())?;
    Ok(LayoutFrame {
        layout,
        buffers,
        base_ptrs: wire.base_ptrs,
        limits: wire.limits,
    })
}

/// 64-bit FNV-1a: stable across builds and platforms (unlike `std`'s hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A short stable hash of everything that decides the plans: both sides' layouts and
/// buffers, the decode-replica mode, token maps, the wire versions and the planning rules.
/// Equal on both sides exactly when they build the same planner.
pub fn fingerprint(planner: &Planner) -> String {
    let (prefill, decode): (Vec<BufferLayout>, Vec<BufferLayout>) =
        planner.buffer_pairs().map(|(p, d)| (*p, *d)).unzip();
    let text = format!(
        "pdplan plan rules {PLANNING_RULES_VERSION}, fragments v{LATEST_VERSION}, {}\n{}\n{}\n\
         {} {}",
        String::from_utf8_lossy(LAYOUT_VERSION_FRAME),
        side_text(planner.prefill(), &prefill),
        side_text(planner.decode(), &decode),
        planner.decode_replicas().as_str(),
        planner.token_maps()
    );
    // A failover plans differently: its gone ranks are part of what both sides must agree on
    // (a planner of every rank keeps the fingerprint it always had).
    let gone = planner.unavailable_prefill_ranks();
    let text = if gone.is_empty() {
        text
    } else {
        format!("{text}\nunavailable prefill ranks {gone:?}")
    };
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// The first field in which `got` differs from `expected` (one side's layout and buffers),
/// phrased for a message: `decode buffer 17 (layer 8, target_v): bytes_per_logical_unit 256
/// vs 128` (expected first). `None` when they are the same.
pub fn first_difference(
    expected: (&ParallelLayout, &[BufferLayout]),
    got: (&ParallelLayout, &[BufferLayout]),
) -> Option<String> {
    let role = expected.0.role().as_str();
    let (mut a, mut b) = (String::new(), String::new());
    write_layout(&mut a, expected.0);
    write_layout(&mut b, got.0);
    if let Some(field) = first_field(&a, &b) {
        return Some(format!("{role} layout: {field}"));
    }
    if expected.1.len() != got.1.len() {
        return Some(format!(
            "{role} layout: {} buffers vs {}",
            expected.1.len(),
            got.1.len()
        ));
    }
    for (position, (x, y)) in expected.1.iter().zip(got.1).enumerate() {
        let (mut a, mut b) = (String::new(), String::new());
        write_buffer(&mut a, x);
        write_buffer(&mut b, y);
        if let Some(field) = first_field(&a, &b) {
            let layer = x.layer.map_or_else(String::new, |l| format!("layer {l}, "));
            return Some(format!(
                "{role} buffer {position} ({layer}{}): {field}",
                x.buffer_kind.as_str()
            ));
        }
    }
    None
}

/// The first `"key":value` pair of two field lists written alike that differs, as `key a vs b`.
fn first_field(a: &str, b: &str) -> Option<String> {
    let fields = |text: &str| -> Vec<(String, String)> {
        let inner = text.trim_start_matches('{').trim_end_matches('}');
        let mut out = Vec::new();
        let mut depth = 0usize;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    out.push(inner[start..i].to_owned());
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(inner[start..].to_owned());
        out.into_iter()
            .map(|pair| {
                let (key, value) = pair.split_once(':').unwrap_or((&pair, ""));
                (key.trim_matches('"').to_owned(), value.replace('"', ""))
            })
            .collect()
    };
    fields(a)
        .into_iter()
        .zip(fields(b))
        .find(|(x, y)| x != y)
        .map(|((key, x), (_, y))| format!("{key} {x} vs {y}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::tests::buffer;

    fn side() -> (ParallelLayout, Vec<BufferLayout>) {
        let layout = ParallelLayout::new(Role::Decode, 4, 1).unwrap();
        let v = BufferLayout {
            buffer_index: 1,
            buffer_kind: BufferKind::TargetV,
            layer: Some(0),
            ..buffer()
        };
        (layout, vec![buffer(), v])
    }

    #[test]
    fn frames_round_trip_and_are_strict() {
        let (layout, buffers) = side();
        let (version, payload) = encode(&layout, &buffers, Some(&[1, 2]), Some(&[10, 20])).unwrap();
        let frame = decode(&version, &payload, DEFAULT_MAX_LAYOUT_BYTES).unwrap();
        assert_eq!(frame.layout, layout);
        assert_eq!(frame.buffers, buffers);
        assert_eq!(frame.base_ptrs, Some(vec![1, 2]));
        let text = String::from_utf8(payload.clone()).unwrap();
        for broken in [
            text.replace("\"dp_size\":1", "\"dp_size\":1,\"extra\":1"),
            text.replace("\"page_size\":16", "\"page_size\":-16"),
            text.replace("\"page_size\":16", "\"page_size\":16.5"),
            text.replace("\"rows_per_page\":1,", ""),
            text.replace("\"target_k\"", "\"target_q\""),
            text.replace("\"base_ptrs\":[1,2]", "\"base_ptrs\":[1]"),
            text[..text.len() - 1].to_owned(),
        ] {
            assert!(
                decode(&version, broken.as_bytes(), DEFAULT_MAX_LAYOUT_BYTES).is_err(),
                "{broken}"
            );
        }
        assert!(decode(b"layout/2", &payload, DEFAULT_MAX_LAYOUT_BYTES).is_err());
        assert!(decode(&version, &payload, 16).is_err());
    }

    #[test]
    fn the_first_difference_is_named() {
        let (layout, buffers) = side();
        assert_eq!(
            first_difference((&layout, &buffers), (&layout, &buffers)),
            None
        );
        let mut other = buffers.clone();
        other[1].bytes_per_logical_unit = 2048;
        assert_eq!(
            first_difference((&layout, &buffers), (&layout, &other)).as_deref(),
            Some("decode buffer 1 (layer 0, target_v): bytes_per_logical_unit 4096 vs 2048")
        );
        let wider = ParallelLayout::new(Role::Decode, 8, 1).unwrap();
        assert_eq!(
            first_difference((&layout, &buffers), (&wider, &buffers)).as_deref(),
            Some("decode layout: world_size 4 vs 8")
        );
    }
}
