//! Buffers read from a runtime's own cache tensors. An array's shape and byte strides, each
//! axis named, say where its pages, tokens, units and planes lie, as a `CuTe` layout does; the
//! `BufferLayout` follows from them instead of being computed by hand. A layout pdplan cannot
//! express (a page axis that is not outermost, padded, overlapping or broadcast strides, a
//! fused plane outside head-major units) is refused naming the axis.

use crate::error::{bail, quoted, PlanResult};
use crate::layout::{BufferKind, BufferLayout, LogicalAxis, LogicalParts, TokenPieces};
use crate::limits::{self, MAX_VALUE};

/// What one axis of a cache array indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// A page (vLLM's block, a state slot): the outermost axis.
    Page,
    /// A flat token pool (`SGLang`): a page is `page_size` consecutive slots.
    Slot,
    /// A token within a page.
    Token,
    /// A row within a page that is not a token (the conv state's kernel taps).
    Row,
    /// The axis split over TP ranks: KV heads, state channels.
    Unit,
    /// K and V of one fused page.
    Plane,
    /// Inner bytes of one unit of one row (head dim, state dims, bytes).
    Dim,
}

impl Axis {
    pub fn parse(text: &str) -> PlanResult<Self> {
        Ok(match text {
            "page" => Self::Page,
            "slot" => Self::Slot,
            "token" => Self::Token,
            "row" => Self::Row,
            "head" | "unit" | "channel" => Self::Unit,
            "plane" => Self::Plane,
            "dim" | "byte" => Self::Dim,
            other => bail!(
                "unknown axis name {}: name each axis one of page, slot, token, row, head (or \
                 unit, channel), plane, dim (or byte)",
                quoted(other)
            ),
        })
    }

    const fn as_str(self) -> &'static str {
        match self {
            Self::Page => "page",
            Self::Slot => "slot",
            Self::Token => "token",
            Self::Row => "row",
            Self::Unit => "head",
            Self::Plane => "plane",
            Self::Dim => "dim",
        }
    }
}

/// The metadata of an array as its exporter describes it; its memory is never read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayView {
    /// Address of element 0.
    pub data: u64,
    pub shape: Vec<u64>,
    /// Bytes between neighbours of each axis (negative: a flipped view).
    pub strides: Vec<i64>,
    pub itemsize: u64,
}

/// What the array does not say: which buffer it is, and how the model spreads its units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArraySpec {
    pub buffer_index: u64,
    pub buffer_kind: BufferKind,
    /// Units of the whole buffer across all TP ranks (the model's KV heads, state channels);
    /// `None` for a replicated buffer (no head axis).
    pub logical_size: Option<u64>,
    pub tp_size: u64,
    /// Tokens a page of a flat pool (`slot` axis) holds.
    pub page_size: Option<u64>,
    pub layer: Option<u64>,
    pub sliding_window: Option<u64>,
    pub attention_chunk_size: Option<u64>,
    pub logical_parts: LogicalParts,
}

/// A buffer as an array holds it: its layout, where page 0 starts, and how many bytes from
/// there the array's own view reaches (the limit no descriptor may pass).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayBuffer {
    pub layout: BufferLayout,
    pub base: u64,
    pub limit: u64,
}

/// One named axis: its extent and byte stride, and where it sits in the array.
#[derive(Debug, Clone, Copy)]
struct Named {
    position: usize,
    axis: Axis,
    extent: u64,
    stride: u64,
}

impl Named {
    fn describe(&self) -> String {
        format!(
            "axis {} ({:?}, {} long, stride {} bytes)",
            self.position,
            self.axis.as_str(),
            self.extent,
            self.stride
        )
    }
}

/// Whether an axis of `extent` steps `want` bytes (any stride does for one element).
const fn steps(extent: u64, stride: u64, want: u64) -> bool {
    extent <= 1 || stride == want
}

fn checked_product(values: &[u64], what: &str) -> PlanResult<u64> {
    values
        .iter()
        .try_fold(1u64, |acc, &v| acc.checked_mul(v))
        .filter(|&v| v <= MAX_VALUE)
        .ok_or_else(|| crate::error::PlanError::new(format!("{what} is 2^63 bytes or more")))
}

/// The array's axes, named and checked one by one.
fn named_axes(view: &ArrayView, axes: &[Axis]) -> PlanResult<Vec<Named>> {
    let ndim = view.shape.len();
    if ndim != view.strides.len() {
        bail!(
            "the array reports {ndim} dimensions but {} strides",
            view.strides.len()
        );
    }
    if axes.len() != ndim {
        bail!(
            "axes names {} axes but the array has {ndim} dimensions (shape {:?}); name every \
             dimension",
            axes.len(),
            view.shape
        );
    }
    limits::ARRAY_AXES.check("a cache array's dimensions", ndim as u64)?;
    if view.itemsize == 0 || view.itemsize > 64 {
        bail!(
            "the array's elements are {} bytes; a dtype of known size (1 to 64 bytes) is needed",
            view.itemsize
        );
    }
    let mut named = Vec::with_capacity(ndim);
    for (position, ((&axis, &extent), &stride)) in
        axes.iter().zip(&view.shape).zip(&view.strides).enumerate()
    {
        let shown = |why: &str| {
            format!(
                "axis {position} ({:?}, {extent} long, stride {stride} bytes) {why}",
                axis.as_str()
            )
        };
        if extent == 0 || extent > MAX_VALUE {
            bail!(
                "{}",
                shown("is empty or too long: a cache holds at least one of each")
            );
        }
        let Ok(stride) = u64::try_from(stride) else {
            bail!(
                "{}",
                shown("runs backwards (a flipped view); pass the cache as allocated")
            );
        };
        if extent > 1 && stride == 0 {
            bail!(
                "{}",
                shown("repeats one element (a broadcast view): every element must own its bytes")
            );
        }
        if axis != Axis::Dim && named.iter().any(|n: &Named| n.axis == axis) {
            bail!("{}", shown("is named twice; only dim axes may repeat"));
        }
        named.push(Named {
            position,
            axis,
            extent,
            stride,
        });
    }
    Ok(named)
}

/// The inner bytes of one unit of one row: the dim axes, innermost last, one contiguous run.
fn inner_bytes(named: &[Named], itemsize: u64) -> PlanResult<u64> {
    let mut want = itemsize;
    for dim in named.iter().rev().filter(|n| n.axis == Axis::Dim) {
        if !steps(dim.extent, dim.stride, want) {
            bail!(
                "{} is not contiguous with what lies inside it ({want} bytes): the dim axes \
                 of a unit must be one dense run, innermost last; pass the cache as allocated",
                dim.describe()
            );
        }
        want = checked_product(&[want, dim.extent], "one unit's row")?;
    }
    Ok(want)
}

/// An axis's (extent, stride), or one element when the array has none.
fn extent_and_stride(named: &[Named], axis: Axis) -> (u64, u64, Option<Named>) {
    named
        .iter()
        .find(|n| n.axis == axis)
        .map_or((1, 0, None), |n| (n.extent, n.stride, Some(*n)))
}

/// Where the pages are: `(pages, page stride, tokens a page, token stride, the token axis)`.
fn pages(named: &[Named], spec: &ArraySpec) -> PlanResult<(u64, u64, u64, u64, Option<Named>)> {
    let page = named.iter().find(|n| n.axis == Axis::Page);
    let slot = named.iter().find(|n| n.axis == Axis::Slot);
    let state = spec.buffer_kind == BufferKind::MambaState;
    let rows_axis = if state { Axis::Row } else { Axis::Token };
    let wrong_rows = if state { Axis::Token } else { Axis::Row };
    if let Some(wrong) = named.iter().find(|n| n.axis == wrong_rows) {
        bail!(
            "{} does not fit a {} buffer: name a KV cache's tokens \"token\", a state's other \
             rows \"row\"",
            wrong.describe(),
            spec.buffer_kind.as_str()
        );
    }
    match (page, slot) {
        (Some(page), None) => {
            let (rows, row_stride, found) = extent_and_stride(named, rows_axis);
            if !state && found.is_none() {
                bail!(
                    "a {} cache indexed by page needs a \"token\" axis (tokens within a page)",
                    spec.buffer_kind.as_str()
                );
            }
            if let Some(size) = spec.page_size.filter(|&size| size != rows && !state) {
                bail!(
                    "page_size={size} but the token axis holds {rows} tokens a page; leave \
                     page_size out for a paged cache (the token axis says it)"
                );
            }
            Ok((page.extent, page.stride, rows, row_stride, found))
        }
        (None, Some(slot)) => {
            if state {
                bail!("a state buffer has no token slots; name its request axis \"page\"");
            }
            if named.iter().any(|n| n.axis == Axis::Token) {
                bail!(
                    "a flat pool's slots are its tokens: name either \"slot\" (with page_size) \
                     or \"page\" and \"token\", not both"
                );
            }
            let Some(size) = spec.page_size.filter(|&s| s > 0) else {
                bail!(
                    "{} is a flat token pool: pass page_size=, the tokens of one page (a page \
                     is page_size consecutive slots)",
                    slot.describe()
                );
            };
            if slot.extent < size {
                bail!(
                    "{} holds fewer slots than one page of page_size={size}",
                    slot.describe()
                );
            }
            let stride = checked_product(&[size, slot.stride], "one page of slots")?;
            Ok((slot.extent / size, stride, size, slot.stride, Some(*slot)))
        }
        (Some(_), Some(_)) => bail!("name one of \"page\" and \"slot\", not both"),
        (None, None) => bail!(
            "no axis is named \"page\" (or \"slot\" for a flat token pool): say which axis \
             indexes pages"
        ),
    }
}

/// Rows a page, bytes one unit takes a page, and the bytes of a page the buffer owns.
struct PageShape {
    rows: u64,
    unit_bytes: u64,
    owned: u64,
}

/// Head-major (each unit's rows together) or token-major (each row's units together), from
/// the strides: `(rows, row stride)`, `(units, unit stride)` and `(planes, plane stride)`.
fn page_shape(
    rows: (u64, u64, Option<Named>),
    units: (u64, u64, Option<Named>),
    planes: (u64, u64, Option<Named>),
    inner: u64,
) -> PlanResult<PageShape> {
    let ((r, sr, row_axis), (u, su, unit_axis), (p, sp, plane_axis)) = (rows, units, planes);
    let row_bytes = checked_product(&[r, inner], "one unit's page")?;
    let units_bytes = checked_product(&[u, row_bytes], "one page")?;
    // Head-major: tokens dense inside a unit, units dense one after another.
    if steps(r, sr, inner) && steps(u, su, row_bytes) {
        if let Some(plane) = plane_axis.filter(|_| p > 1) {
            bail!(
                "{}: a fused page of head-major units is two buffers, not one with planes; \
                 index the plane axis (cache[:, 0], cache[:, 1]) and describe K and V each on \
                 its own",
                plane.describe()
            );
        }
        return Ok(PageShape {
            rows: 1,
            unit_bytes: row_bytes,
            owned: units_bytes,
        });
    }
    // Token-major: units dense inside a row, rows evenly apart, planes of whole rows.
    let unit_row = checked_product(&[u, inner], "one row")?;
    if steps(u, su, inner) && (r <= 1 || sr >= unit_row) {
        let row_stride = if r > 1 { sr } else { unit_row };
        let plane_bytes = checked_product(&[r, row_stride], "one plane")?;
        if !steps(p, sp, plane_bytes) {
            let plane = plane_axis.map_or_else(String::new, |n| n.describe());
            bail!(
                "{plane}: a fused page must hold each plane's rows together (plane stride {} \
                 bytes, rows x row stride); index the plane axis and describe each plane on \
                 its own",
                plane_bytes
            );
        }
        return Ok(PageShape {
            rows: checked_product(&[r, p], "rows")?,
            unit_bytes: checked_product(&[row_bytes, p], "one unit's page")?,
            owned: checked_product(&[plane_bytes, p], "one page")?,
        });
    }
    // Units whole and dense inside, evenly apart with room for whole units between: each
    // unit's bytes lie among other arrays' (vLLM's cross-layer BHLNC keeps every layer's
    // page of a head together, so one layer's heads are a layer-count apart).
    if u > 1 && steps(r, sr, inner) && su > row_bytes && su % row_bytes == 0 {
        let between = su / row_bytes - 1;
        bail!(
            "{}: units of {row_bytes} bytes lie {su} bytes apart, room for {between} more \
             between each two: the array is one of several interleaved unit by unit, as vLLM's \
             cross-layer layout BHLNC (VLLM_KV_CACHE_LAYOUT=BHLNC) keeps every layer's page of \
             a head together. Describe the allocation they interleave in as one buffer (a \
             (page, head, token, dim) view of its whole block, the token axis running through \
             every layer's tokens: a head then holds every layer's bytes, pages move whole, and \
             both sides must hold the same layers), or serve with a layer-compact layout \
             (vLLM: VLLM_KV_CACHE_LAYOUT=LBHNC for HND pages, LBNHC for NHD)",
            unit_axis.map_or_else(|| "the units".to_owned(), |n| n.describe())
        );
    }
    let blame = if steps(u, su, inner) || steps(u, su, row_bytes) {
        row_axis
    } else {
        unit_axis
    };
    let blamed = blame.map_or_else(|| "the rows".to_owned(), |n| n.describe());
    bail!(
        "{blamed}: the page is neither head-major (tokens {inner} bytes apart inside a unit, \
         units {row_bytes} apart) nor token-major (units {inner} bytes apart inside a row, rows \
         at least {unit_row} apart); padded or interleaved strides are not expressible"
    );
}

/// The logical axis, size and replica group of the buffer, and the units a rank must hold.
fn logical(
    spec: &ArraySpec,
    units: u64,
    unit_axis: Option<Named>,
) -> PlanResult<(LogicalAxis, u64, u64)> {
    let kind = spec.buffer_kind.as_str();
    let Some(unit_axis) = unit_axis else {
        if spec.buffer_kind == BufferKind::MambaState {
            bail!("a state buffer needs a \"channel\" axis: the channels split over TP ranks");
        }
        if spec.logical_size.is_some_and(|l| l != 1) {
            bail!(
                "a {kind} cache without a head axis is replicated (every rank holds it whole, \
                 MLA); leave logical_size out or name the head axis"
            );
        }
        return Ok((LogicalAxis::Replicated, 1, 1));
    };
    let axis = if spec.buffer_kind == BufferKind::MambaState {
        LogicalAxis::StateChannel
    } else {
        LogicalAxis::KvHead
    };
    let Some(logical) = spec.logical_size.filter(|&l| l > 0) else {
        bail!(
            "logical_size= is needed: the units of {} across all TP ranks (the model's KV \
             heads, or state channels)",
            unit_axis.describe()
        );
    };
    let tp = spec.tp_size;
    if tp == 0 {
        bail!("tp_size must be positive");
    }
    // GQA: more TP ranks than KV heads hold each head on tp / heads ranks.
    let replica = if axis == LogicalAxis::KvHead && tp > logical {
        if tp % logical != 0 {
            bail!(
                "tp_size={tp} is above the {logical} KV heads but not a multiple of them: the \
                 heads cannot be replicated evenly"
            );
        }
        tp / logical
    } else {
        1
    };
    let shards = tp / replica;
    let share = spec
        .logical_parts
        .check_cuts(logical, shards)
        .ok()
        .map(|()| spec.logical_parts.shard_units(logical, shards));
    if share != Some(units) {
        // Mamba2 below n_groups: vLLM and SGLang copy B and C's groups onto every rank.
        let copied_parts = if spec.logical_parts.given().is_empty()
            || !spec.logical_parts.groups().is_empty()
            || units * shards <= logical
        {
            ""
        } else {
            "; a rank holding more than its share of the parts is a state whose parts are \
             copied to every rank (Mamba2's B and C when n_groups is below TP): name each \
             part's groups (logical_part_groups, n_groups for B and C)"
        };
        bail!(
            "{} holds {units} units, but a rank of TP {tp} holds {} of the buffer's \
             logical_size={logical}; check logical_size (the whole model's, not the rank's) \
             and tp_size{copied_parts}",
            unit_axis.describe(),
            share.map_or_else(
                || format!("{logical}/{shards} (not whole)"),
                |n| n.to_string()
            )
        );
    }
    Ok((axis, logical, replica))
}

/// The bytes of the array's view from element 0: where its last element ends.
fn view_extent(named: &[Named], itemsize: u64) -> PlanResult<u64> {
    named
        .iter()
        .try_fold(itemsize, |end, n| {
            (n.extent - 1)
                .checked_mul(n.stride)
                .and_then(|reach| end.checked_add(reach))
        })
        .filter(|&end| end <= MAX_VALUE)
        .ok_or_else(|| crate::error::PlanError::new("the array spans 2^63 bytes or more"))
}

/// The buffer an array holds, with its base and limit.
pub fn buffer_from_array(
    view: &ArrayView,
    axes: &[Axis],
    spec: &ArraySpec,
) -> PlanResult<ArrayBuffer> {
    let named = named_axes(view, axes)?;
    let inner = inner_bytes(&named, view.itemsize)?;
    let (page_count, page_stride, page_size, token_stride, token_axis) = pages(&named, spec)?;
    let units = extent_and_stride(&named, Axis::Unit);
    let planes = extent_and_stride(&named, Axis::Plane);
    if planes.2.is_some() && spec.buffer_kind == BufferKind::MambaState {
        bail!("a state buffer has no K/V planes");
    }
    let shape = page_shape((page_size, token_stride, token_axis), units, planes, inner)?;
    if page_count > 1 && page_stride < shape.owned {
        let page = named
            .iter()
            .find(|n| matches!(n.axis, Axis::Page | Axis::Slot))
            .map_or_else(String::new, Named::describe);
        bail!(
            "{page}: pages {page_stride} bytes apart overlap, one page holds {} bytes; the page \
             axis must be the outermost (pass the cache as allocated, pages first)",
            shape.owned
        );
    }
    let item_stride = page_stride.max(shape.owned);
    let (logical_axis, logical_size, replica) = logical(spec, units.0, units.2)?;
    let state = spec.buffer_kind == BufferKind::MambaState;
    let layout = BufferLayout {
        buffer_index: spec.buffer_index,
        buffer_kind: spec.buffer_kind,
        logical_axis,
        logical_size,
        page_size: if state { 1 } else { page_size },
        bytes_per_logical_unit: shape.unit_bytes,
        item_stride_bytes: item_stride,
        tp_replica_group_size: replica,
        layer: spec.layer,
        rows_per_page: shape.rows,
        page_bytes: (shape.owned < item_stride).then_some(shape.owned),
        logical_parts: spec.logical_parts,
        sliding_window: spec.sliding_window,
        attention_chunk_size: spec.attention_chunk_size,
        token_pieces: TokenPieces::NONE,
    };
    layout.validate()?;
    let limit = view_extent(&named, view.itemsize)?;
    if view.data.checked_add(limit).is_none() {
        bail!("the array's address plus its extent passes 2^64");
    }
    Ok(ArrayBuffer {
        layout,
        base: view.data,
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: BufferKind, logical: Option<u64>, tp: u64) -> ArraySpec {
        ArraySpec {
            buffer_index: 0,
            buffer_kind: kind,
            logical_size: logical,
            tp_size: tp,
            page_size: None,
            layer: None,
            sliding_window: None,
            attention_chunk_size: None,
            logical_parts: LogicalParts::WHOLE,
        }
    }

    /// A C-ordered view of `shape` elements of `itemsize` bytes, axes permuted by `order`
    /// (memory order, outermost first), as a runtime's stride-permuted tensor is.
    fn view(shape: &[u64], order: &[usize], itemsize: u64) -> ArrayView {
        let mut strides = vec![0i64; shape.len()];
        let mut step = itemsize;
        for &axis in order.iter().rev() {
            strides[axis] = i64::try_from(step).unwrap();
            step *= shape[axis];
        }
        ArrayView {
            data: 4096,
            shape: shape.to_vec(),
            strides,
            itemsize,
        }
    }

    fn axes(names: &[&str]) -> Vec<Axis> {
        names.iter().map(|n| Axis::parse(n).unwrap()).collect()
    }

    #[test]
    fn strides_decide_head_or_token_major() {
        // (blocks, block_size, heads, dim) of 2-byte elements: NHD, then HND by strides.
        let names = axes(&["page", "token", "head", "dim"]);
        let nhd = buffer_from_array(
            &view(&[10, 16, 4, 64], &[0, 1, 2, 3], 2),
            &names,
            &spec(BufferKind::TargetK, Some(8), 2),
        )
        .unwrap();
        assert_eq!(nhd.layout.rows_per_page, 16);
        assert_eq!(nhd.layout.bytes_per_logical_unit, 16 * 64 * 2);
        assert_eq!(nhd.layout.item_stride_bytes, 16 * 4 * 64 * 2);
        assert_eq!(nhd.limit, 10 * 16 * 4 * 64 * 2);
        let hnd = buffer_from_array(
            &view(&[10, 16, 4, 64], &[0, 2, 1, 3], 2),
            &names,
            &spec(BufferKind::TargetK, Some(8), 2),
        )
        .unwrap();
        assert_eq!(hnd.layout.rows_per_page, 1);
        assert_eq!(hnd.layout.item_stride_bytes, nhd.layout.item_stride_bytes);
        assert_eq!(hnd.layout.page_bytes, None);
    }

    #[test]
    fn what_cannot_be_expressed_is_refused_naming_the_axis() {
        let names = axes(&["page", "token", "head", "dim"]);
        let k = spec(BufferKind::TargetK, Some(4), 1);
        // Pages inside tokens: the page axis is not outermost.
        let err =
            buffer_from_array(&view(&[10, 16, 4, 64], &[1, 0, 2, 3], 2), &names, &k).unwrap_err();
        assert!(err.message().contains("outermost"), "{err}");
        // Dim not innermost.
        let err =
            buffer_from_array(&view(&[10, 16, 4, 64], &[0, 1, 3, 2], 2), &names, &k).unwrap_err();
        assert!(err.message().contains("axis 3"), "{err}");
        let mut padded = view(&[10, 16, 4, 64], &[0, 2, 1, 3], 2);
        padded.strides[2] += 2;
        let err = buffer_from_array(&padded, &names, &k).unwrap_err();
        assert!(err.message().contains("neither head-major"), "{err}");
        let mut flipped = view(&[10, 16, 4, 64], &[0, 1, 2, 3], 2);
        flipped.strides[1] = -flipped.strides[1];
        assert!(buffer_from_array(&flipped, &names, &k)
            .unwrap_err()
            .message()
            .contains("backwards"));
        let mut broadcast = view(&[10, 16, 4, 64], &[0, 1, 2, 3], 2);
        broadcast.strides[2] = 0;
        assert!(buffer_from_array(&broadcast, &names, &k)
            .unwrap_err()
            .message()
            .contains("broadcast"));
        let unknown = ArrayView {
            itemsize: 0,
            ..view(&[10, 16, 4, 64], &[0, 1, 2, 3], 2)
        };
        assert!(buffer_from_array(&unknown, &names, &k).is_err());
        let wrong_heads = spec(BufferKind::TargetK, Some(4), 2);
        let err = buffer_from_array(
            &view(&[10, 16, 4, 64], &[0, 1, 2, 3], 2),
            &names,
            &wrong_heads,
        )
        .unwrap_err();
        assert!(err.message().contains("logical_size"), "{err}");
    }

    #[test]
    fn a_fused_page_gives_planes_or_two_buffers() {
        // FlashInfer NHD (blocks, 2, block_size, heads, dim): one buffer with two planes.
        let fused = buffer_from_array(
            &view(&[6, 2, 16, 2, 8], &[0, 1, 2, 3, 4], 2),
            &axes(&["page", "plane", "token", "head", "dim"]),
            &spec(BufferKind::TargetK, Some(2), 1),
        )
        .unwrap();
        assert_eq!(fused.layout.rows_per_page, 32);
        // Its K half alone: rows of the half, the fused page as stride.
        let mut k = view(&[6, 2, 16, 2, 8], &[0, 1, 2, 3, 4], 2);
        k.shape.remove(1);
        k.strides.remove(1);
        let half = buffer_from_array(
            &k,
            &axes(&["page", "token", "head", "dim"]),
            &spec(BufferKind::TargetK, Some(2), 1),
        )
        .unwrap();
        assert_eq!(half.layout.item_stride_bytes, 2 * 16 * 2 * 8 * 2);
        assert_eq!(half.layout.page_bytes, Some(16 * 2 * 8 * 2));
        assert_eq!(half.layout.rows_per_page, 16);
        // Head-major fused pages cannot be one buffer.
        let err = buffer_from_array(
            &view(&[6, 2, 16, 2, 8], &[0, 1, 3, 2, 4], 2),
            &axes(&["page", "plane", "token", "head", "dim"]),
            &spec(BufferKind::TargetK, Some(2), 1),
        )
        .unwrap_err();
        assert!(err.message().contains("index the plane axis"), "{err}");
    }

    #[test]
    fn flat_pools_and_replicated_and_state() {
        let pool = ArraySpec {
            page_size: Some(64),
            ..spec(BufferKind::TargetK, Some(8), 4)
        };
        let b = buffer_from_array(
            &view(&[64 * 5 + 64, 2, 128], &[0, 1, 2], 2),
            &axes(&["slot", "head", "dim"]),
            &pool,
        )
        .unwrap();
        assert_eq!((b.layout.page_size, b.layout.rows_per_page), (64, 64));
        assert_eq!(b.layout.item_stride_bytes, 64 * 2 * 128 * 2);
        assert_eq!(b.limit, 384 * 2 * 128 * 2);
        let mla = buffer_from_array(
            &view(&[10, 16, 576], &[0, 1, 2], 2),
            &axes(&["page", "token", "dim"]),
            &spec(BufferKind::TargetK, None, 8),
        )
        .unwrap();
        assert_eq!(mla.layout.logical_axis, LogicalAxis::Replicated);
        assert_eq!(mla.layout.bytes_per_logical_unit, 16 * 576 * 2);
        let conv = buffer_from_array(
            &view(&[9, 96, 3], &[0, 1, 2], 4),
            &axes(&["page", "channel", "dim"]),
            &spec(BufferKind::MambaState, Some(192), 2),
        )
        .unwrap();
        assert_eq!(conv.layout.logical_axis, LogicalAxis::StateChannel);
        assert_eq!(conv.layout.bytes_per_logical_unit, 12);
        let taps_outside = buffer_from_array(
            &view(&[9, 3, 96], &[0, 1, 2], 4),
            &axes(&["page", "row", "channel"]),
            &spec(BufferKind::MambaState, Some(192), 2),
        )
        .unwrap();
        assert_eq!(taps_outside.layout.rows_per_page, 3);
    }
}
