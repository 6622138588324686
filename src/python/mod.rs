//! The one binding module: converts Python values to core values and back (`convert`,
//! `objects`), judges only Python types (every other rule is the core's), releases the GIL
//! around core work, and maps every core error to `UnsupportedPDLayoutError` in one function,
//! `to_py_err`. `planner` holds the planner class, `prepared` the per-request class, `model` the
//! model entry points; this file the wire and descriptor functions and the module itself.
//!
//! The doc comments of what Python sees are its docstrings, written from the stub by
//! `scripts/stub_docs.py` in Sphinx's markup (`:param name:`), not rustdoc's.
#![allow(clippy::doc_markdown)]

mod arrays;
mod convert;
mod encode_cache;
mod floors;
mod fragment_slots;
mod layouts;
mod model;
mod objects;
mod package_types;
mod planner;
mod posting;
mod prepared;
mod request;
mod slice_args;
mod staging;

use numpy::{IntoPyArray, PyArray1};
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyRange, PyTuple};

use crate::context::{CpSplit, TokenDeal, TokenShare};
use crate::descriptors;
use crate::error::{bail, PlanError};
use crate::fragment::FieldValue;
use crate::layout::LogicalAxis;
use crate::limits;
use crate::{context, wire};
use convert::{
    buffer_layout, buffers, fragment_with, fragments_of, frame, i64_column, int_arg, optional_u64,
    parallel_layout, string_arg, to_u64, u64_column, Converted,
};
use objects::{descriptors_object, model_types, FragmentFactory};

/// Descriptor arrays are large, short-lived allocations; mimalloc keeps freed pages for the next
/// request instead of returning them to the kernel and faulting them back in each time (as
/// pydantic-core does, for the same reason).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

create_exception!(
    _core,
    UnsupportedPDLayoutError,
    PyValueError,
    "A layout, plan, frame or request pdplan cannot serve; the message says what to change."
);

/// The single place a core error becomes a Python exception.
fn to_py_err(error: PlanError) -> PyErr {
    UnsupportedPDLayoutError::new_err(error.into_message())
}

/// Validates a `ParallelLayout` (called from its `__post_init__`) and returns its TP size.
#[pyfunction]
fn check_parallel_layout(layout: &Bound<'_, PyAny>) -> PyResult<u64> {
    parallel_layout(layout)
        .map(|layout| layout.ranks().tp_size())
        .map_err(to_py_err)
}

/// Where rank `rank` of a layout sits: (DP group, pipeline stage, CP rank, TP rank).
#[pyfunction]
fn rank_coordinates(
    layout: &Bound<'_, PyAny>,
    rank: &Bound<'_, PyAny>,
) -> PyResult<(u64, u64, u64, u64)> {
    let convert =
        || -> Converted<_> { parallel_layout(layout)?.rank_coord(int_arg(rank, "rank")?) };
    let at = convert().map_err(to_py_err)?;
    Ok((at.dp_group, at.stage, at.cp_rank, at.tp_rank))
}

/// Which share of a request's tokens rank `rank` of a layout holds: (ranks the tokens are
/// dealt over, its index among them, the split, the interleave).
#[pyfunction]
fn rank_token_share(
    layout: &Bound<'_, PyAny>,
    rank: &Bound<'_, PyAny>,
) -> PyResult<(u64, u64, &'static str, u64)> {
    let convert = || -> Converted<_> {
        let layout = parallel_layout(layout)?;
        let at = layout.rank_coord(int_arg(rank, "rank")?)?;
        let context = layout.context();
        Ok((
            context.ways(),
            context.share_index(at.slot()),
            context.split.as_str(),
            context.interleave,
        ))
    };
    convert().map_err(to_py_err)
}

/// Whether buffers of `logical_axis` hold a value per token (slot maps apply).
#[pyfunction]
fn is_token_indexed(logical_axis: &Bound<'_, PyAny>) -> PyResult<bool> {
    let convert = || -> Converted<_> {
        Ok(LogicalAxis::parse(&string_arg(logical_axis, "logical_axis")?)?.is_token_indexed())
    };
    convert().map_err(to_py_err)
}

/// Validates a `BufferLayout` (called from its `__post_init__`).
#[pyfunction]
fn check_buffer_layout(buffer: &Bound<'_, PyAny>) -> PyResult<()> {
    buffer_layout(buffer).map(|_| ()).map_err(to_py_err)
}

/// Validates a `TransferFragment` (called from its `__post_init__`).
#[pyfunction]
fn check_transfer_fragment(fragment_obj: &Bound<'_, PyAny>) -> PyResult<()> {
    fragment_with(fragment_obj, None)
        .map(|_| ())
        .map_err(to_py_err)
}

/// Fragments as (version frame, payload frame), written in the oldest wire version that
/// carries all of them (``TRANSFER_PLAN_PROTOCOL_VERSION``, 1, for the reference's plans). A
/// list or tuple of the same ``TransferFragment`` objects encoded before returns the same
/// frames from a bounded cache.
///
/// :param fragments: One rank pair's fragments (``RankTransferPlan.fragments_by_prefill_rank``
///     of one source).
#[pyfunction]
fn encode_transfer_fragments<'py>(
    py: Python<'py>,
    fragments: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let types = model_types(py)?;
    let addresses = encode_cache::fragment_addresses(fragments, types.fragment.bind(py));
    if let Some(frames) = addresses.as_deref().and_then(|a| encode_cache::get(py, a)) {
        return Ok(frames);
    }
    let converted = fragments_of(fragments, "fragments", types).map_err(to_py_err)?;
    let (version, payload) = py.detach(|| wire::encode(&converted));
    let frames = (PyBytes::new(py, &version), PyBytes::new(py, &payload));
    if let Some(addresses) = addresses {
        encode_cache::insert(fragments, &addresses, &frames.0, &frames.1)?;
    }
    Ok(frames)
}

/// Whether `TransferFragment`'s slot layout checked out on this Python, so fragments are made
/// and read through their slots (else through attributes, the same values more slowly).
#[pyfunction]
fn fragment_slots_checked(py: Python<'_>) -> PyResult<bool> {
    Ok(model_types(py)?.fragment_slots.is_some())
}

/// The encoded-frame cache: (entries, fragment objects held).
#[pyfunction]
fn encode_cache_info() -> (usize, usize) {
    encode_cache::stats()
}

/// The frame limits a caller passed, or the defaults.
fn frame_limits(
    max_payload_bytes: Option<&Bound<'_, PyAny>>,
    max_fragments: Option<&Bound<'_, PyAny>>,
) -> Converted<wire::FrameLimits> {
    let defaults = wire::FrameLimits::DEFAULT;
    Ok(wire::FrameLimits {
        max_payload_bytes: optional_u64(max_payload_bytes, "max_payload_bytes")?
            .unwrap_or(defaults.max_payload_bytes),
        max_fragments: optional_u64(max_fragments, "max_fragments")?
            .unwrap_or(defaults.max_fragments),
    })
}

/// The fragments a peer's frames carry, read strictly: a payload over ``max_payload_bytes``
/// is refused before it is parsed, a frame breaking any rule of the wire format names what is
/// wrong. Both frames empty or None is no fragments; one without the other is refused.
///
/// :param version_frame: The version frame, ``b"1"`` to ``b"6"``
///     (``TRANSFER_PLAN_READABLE_VERSIONS``).
/// :param payload_frame: The payload frame: one JSON array of fragment objects.
/// :param max_payload_bytes: The longest payload accepted; None: ``DEFAULT_MAX_PAYLOAD_BYTES``.
/// :param max_fragments: The most fragments accepted; None: ``DEFAULT_MAX_FRAGMENTS``.
#[pyfunction]
#[pyo3(signature = (version_frame, payload_frame, *, max_payload_bytes=None, max_fragments=None))]
fn decode_transfer_fragments<'py>(
    py: Python<'py>,
    version_frame: &Bound<'py, PyAny>,
    payload_frame: &Bound<'py, PyAny>,
    max_payload_bytes: Option<&Bound<'py, PyAny>>,
    max_fragments: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let convert = || -> Converted<_> {
        let limits = frame_limits(max_payload_bytes, max_fragments)?;
        let version = frame(version_frame, "version_frame")?;
        let payload = frame(payload_frame, "payload_frame")?;
        // Bounded before anything is parsed.
        if let Some(payload) = payload {
            wire::check_payload_len(payload.len(), limits)?;
        }
        // Parsed in place without the GIL: bytes are immutable and the caller holds them.
        py.detach(|| wire::decode_with(version, payload, limits))
    };
    let fragments = convert().map_err(to_py_err)?;
    FragmentFactory::new(py)?.tuple(&fragments)
}

/// The descriptors of `fragments` x page pairs as three uint64 arrays (src, dst, length);
/// everything is checked before anything is built, and the build runs without the GIL.
#[pyfunction]
#[pyo3(signature = (fragments, src_base_ptrs, dst_base_ptrs, src_pages, dst_pages, *, coalesce=true, src_limits=None, dst_limits=None))]
#[allow(clippy::too_many_arguments)]
fn transfer_descriptors<'py>(
    py: Python<'py>,
    fragments: &Bound<'py, PyAny>,
    src_base_ptrs: &Bound<'py, PyAny>,
    dst_base_ptrs: &Bound<'py, PyAny>,
    src_pages: &Bound<'py, PyAny>,
    dst_pages: &Bound<'py, PyAny>,
    coalesce: bool,
    src_limits: Option<&Bound<'py, PyAny>>,
    dst_limits: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let types = model_types(py)?;
    let convert = || -> Converted<_> {
        Ok((
            fragments_of(fragments, "fragments", types)?,
            buffers(src_base_ptrs, src_limits, "src")?,
            buffers(dst_base_ptrs, dst_limits, "dst")?,
            u64_column(src_pages, "src_pages")?,
            u64_column(dst_pages, "dst_pages")?,
        ))
    };
    let (fragments, src, dst, src_pages, dst_pages) = convert().map_err(to_py_err)?;
    let built = py
        .detach(|| descriptors::build(&fragments, (&src, &dst), (&src_pages, &dst_pages), coalesce))
        .map_err(to_py_err)?;
    descriptors_object(py, built)
}

/// A token deal from Python arguments: `cp_size` ways, split, interleave, page size.
fn token_deal(
    cp_size: &Bound<'_, PyAny>,
    cp_split: Option<&Bound<'_, PyAny>>,
    interleave: &Bound<'_, PyAny>,
    page_size: u64,
) -> Converted<TokenDeal> {
    let split = match cp_split.filter(|s| !s.is_none()) {
        None => CpSplit::Interleave,
        Some(value) => CpSplit::parse(&string_arg(value, "cp_split")?)?,
    };
    let ways = to_u64(cp_size, "cp_size")?;
    TokenDeal::new(ways, split, to_u64(interleave, "interleave")?, page_size)
}

/// One rank's slot map for a request: for each token `t` of `tokens` (a `range`, default all)
/// that rank `rank` of `layout` holds (all of them without a layout), at local index `i`,
/// `page_table[i // page_size] * page_size + i % page_size`; -1 elsewhere.
#[pyfunction]
#[pyo3(signature = (page_table, page_size, num_tokens, *, tokens=None, layout=None, rank=None))]
fn token_slots<'py>(
    py: Python<'py>,
    page_table: &Bound<'py, PyAny>,
    page_size: &Bound<'py, PyAny>,
    num_tokens: &Bound<'py, PyAny>,
    tokens: Option<&Bound<'py, PyAny>>,
    layout: Option<&Bound<'py, PyAny>>,
    rank: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let given = |value: Option<&Bound<'py, PyAny>>| value.filter(|v| !v.is_none()).cloned();
    let convert = || -> Converted<_> {
        let range = match given(tokens) {
            None => None,
            Some(value) => Some(token_range(&value)?),
        };
        let size = to_u64(page_size, "page_size")?;
        let share = match (given(layout), given(rank)) {
            (None, None) => TokenShare::WHOLE,
            (Some(layout), Some(rank)) => {
                parallel_layout(&layout)?.token_share(int_arg(&rank, "rank")?, size)?
            }
            _ => bail!(
                "token_slots takes layout= and rank= together (the rank's share of the tokens), \
                 or neither (every token)"
            ),
        };
        Ok((
            i64_column(page_table, "page_table")?,
            size,
            to_u64(num_tokens, "num_tokens")?,
            range,
            share,
        ))
    };
    let (table, size, count, range, share) = convert().map_err(to_py_err)?;
    let slots = py
        .detach(|| context::token_slots(&table, size, count, range, share))
        .map_err(to_py_err)?;
    Ok(slots.into_pyarray(py))
}

/// The CP rank holding each token of a request of `num_tokens` tokens, as an int64 array.
#[pyfunction]
#[pyo3(signature = (num_tokens, cp_size, *, cp_split=None, interleave=None, page_size=None))]
fn token_owners<'py>(
    py: Python<'py>,
    num_tokens: &Bound<'py, PyAny>,
    cp_size: &Bound<'py, PyAny>,
    cp_split: Option<&Bound<'py, PyAny>>,
    interleave: Option<&Bound<'py, PyAny>>,
    page_size: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let one = 1u64.into_pyobject(py)?.into_any();
    let or =
        |value: Option<&Bound<'py, PyAny>>| value.filter(|v| !v.is_none()).unwrap_or(&one).clone();
    let convert = || -> Converted<_> {
        let size = to_u64(&or(page_size), "page_size")?;
        let deal = token_deal(cp_size, cp_split, &or(interleave), size)?;
        Ok((deal, to_u64(num_tokens, "num_tokens")?))
    };
    let (deal, count) = convert().map_err(to_py_err)?;
    let owners = py.detach(|| deal.owners(count)).map_err(to_py_err)?;
    Ok(owners.into_pyarray(py))
}

/// A Python `range` of tokens.
fn token_range(value: &Bound<'_, PyAny>) -> Converted<context::TokenRange> {
    let Ok(range) = value.cast::<PyRange>() else {
        bail!(
            "tokens must be a range of token positions (range(start, stop)), got {}",
            value
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string())
        );
    };
    let field = |name: &str| -> Converted<i64> {
        range
            .getattr(name)
            .and_then(|v| v.extract::<i64>())
            .map_err(|_| PlanError::new(format!("tokens: range {name} must fit 64 bits")))
    };
    Ok(context::TokenRange {
        start: field("start")?,
        stop: field("stop")?,
        step: field("step")?,
    })
}

/// The schema's defaults as a `{name: value}` dict (required fields left out).
fn fragment_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let defaults = PyDict::new(py);
    for field in &crate::fragment::FIELDS {
        let Some(default) = field.default else {
            continue;
        };
        let value = match default {
            FieldValue::Int(v) => v.into_pyobject(py)?.into_any(),
            FieldValue::OptionalInt(v) => v.into_pyobject(py)?.into_any(),
            FieldValue::Kind(kind) => kind.as_str().into_pyobject(py)?.into_any(),
        };
        defaults.set_item(field.name, value)?;
    }
    Ok(defaults)
}

/// Every bound of `crate::limits` as a module constant (`pdplan.limits` re-exports them).
fn add_limits(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for limit in limits::ALL {
        m.add(limit.name, limit.max)?;
    }
    // Each bound's (name, least, most, unit, advice), for the docs' table.
    let rows: Vec<_> = limits::ALL
        .iter()
        .map(|l| (l.name, l.min, l.max, l.unit, l.advice))
        .collect();
    m.add("LIMITS", rows)?;
    m.add("MAX_VALUE", limits::MAX_VALUE)?;
    m.add(
        "DEFAULT_MAX_PAYLOAD_BYTES",
        limits::DEFAULT_MAX_PAYLOAD_BYTES,
    )?;
    m.add("DEFAULT_MAX_FRAGMENTS", limits::DEFAULT_MAX_FRAGMENTS)?;
    m.add("DEFAULT_MAX_LAYOUT_BYTES", limits::DEFAULT_MAX_LAYOUT_BYTES)?;
    m.add("FRAME_CACHE_ENTRIES", limits::FRAME_CACHE_ENTRIES)?;
    m.add("FRAME_CACHE_BYTES", limits::FRAME_CACHE_BYTES)?;
    m.add("ENCODE_CACHE_ENTRIES", limits::ENCODE_CACHE_ENTRIES)?;
    m.add("ENCODE_CACHE_ITEMS", limits::ENCODE_CACHE_ITEMS)?;
    Ok(())
}

/// `gil_used = true`: no free-threaded interpreter runs the suite here, so the module does not
/// claim to be safe without the GIL (a free-threaded `CPython` re-enables the GIL on import).
#[pymodule(gil_used = true)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add(
        "UnsupportedPDLayoutError",
        py.get_type::<UnsupportedPDLayoutError>(),
    )?;
    m.add("TRANSFER_PLAN_PROTOCOL_VERSION", wire::PROTOCOL_VERSION)?;
    m.add(
        "TRANSFER_PLAN_READABLE_VERSIONS",
        PyTuple::new(py, wire::READABLE_VERSIONS)?,
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<planner::PyPlanner>()?;
    m.add_class::<prepared::PyPrepared>()?;
    m.add_class::<request::PyPreparedRequest>()?;
    m.add_class::<staging::PyStagingPlan>()?;
    m.add_function(wrap_pyfunction!(staging::estimate_staging, m)?)?;
    m.add_function(wrap_pyfunction!(staging::check_cost_model, m)?)?;
    m.add_function(wrap_pyfunction!(staging::layer_groups, m)?)?;
    m.add_function(wrap_pyfunction!(staging::scaled_counts, m)?)?;
    m.add_function(wrap_pyfunction!(posting::estimate_forms, m)?)?;
    m.add_function(wrap_pyfunction!(posting::check_strided_costs, m)?)?;
    m.add_function(wrap_pyfunction!(posting::fit_timings, m)?)?;
    m.add_function(wrap_pyfunction!(prepared::frame_cache_info, m)?)?;
    m.add_function(wrap_pyfunction!(encode_cache_info, m)?)?;
    m.add_function(wrap_pyfunction!(arrays::buffer_from_array, m)?)?;
    m.add_function(wrap_pyfunction!(layouts::encode_layout, m)?)?;
    m.add_function(wrap_pyfunction!(layouts::decode_layout, m)?)?;
    m.add_function(wrap_pyfunction!(check_parallel_layout, m)?)?;
    m.add_function(wrap_pyfunction!(rank_coordinates, m)?)?;
    m.add_function(wrap_pyfunction!(check_buffer_layout, m)?)?;
    m.add_function(wrap_pyfunction!(check_transfer_fragment, m)?)?;
    m.add_function(wrap_pyfunction!(encode_transfer_fragments, m)?)?;
    m.add_function(wrap_pyfunction!(fragment_slots_checked, m)?)?;
    m.add_function(wrap_pyfunction!(floors::remake_fragments, m)?)?;
    m.add_class::<floors::FrameFloor>()?;
    m.add_function(wrap_pyfunction!(decode_transfer_fragments, m)?)?;
    m.add_function(wrap_pyfunction!(transfer_descriptors, m)?)?;
    m.add_function(wrap_pyfunction!(token_slots, m)?)?;
    m.add_function(wrap_pyfunction!(token_owners, m)?)?;
    m.add_function(wrap_pyfunction!(rank_token_share, m)?)?;
    m.add_function(wrap_pyfunction!(is_token_indexed, m)?)?;
    model::register(m)?;
    m.add_function(wrap_pyfunction!(package_types::use_package_types, m)?)?;
    add_limits(m)?;
    // The field orders the binding fills objects in; a test holds them to `dataclasses.fields`.
    let fields = crate::fragment::FIELDS;
    m.add(
        "TRANSFER_FRAGMENT_FIELDS",
        fields.iter().map(|f| f.name).collect::<Vec<_>>(),
    )?;
    // Per field, the first wire version carrying it; a test holds both to the dataclass and to
    // encoded frames.
    m.add(
        "TRANSFER_FRAGMENT_SINCE",
        fields.iter().map(|f| (f.name, f.since)).collect::<Vec<_>>(),
    )?;
    m.add("TRANSFER_FRAGMENT_DEFAULTS", fragment_defaults(py)?)?;
    m.add(
        "RANK_TRANSFER_PLAN_FIELDS",
        objects::RANK_PLAN_FIELDS.to_vec(),
    )?;
    m.add(
        "BUFFER_LAYOUT_FIELDS",
        objects::BUFFER_LAYOUT_FIELDS.to_vec(),
    )?;
    Ok(())
}
