//! The one binding module: converts Python values to core values and back, releases the GIL
//! around core work, and maps every core error to `UnsupportedPDLayoutError` (`to_py_err`).

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyTuple, PyType};

use crate::error::PlanError;
use crate::fragment::Fragment;
use crate::layout::{BufferKind, BufferLayout, LogicalAxis, ParallelLayout, Role, MAX_VALUE};
use crate::planner::{Planner, RankPlan};
use crate::wire;

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

type Converted<T> = Result<T, PlanError>;

// ---------------------------------------------------------------------------------------------
// Python -> core

fn attr<'py>(obj: &Bound<'py, PyAny>, name: &str) -> Converted<Bound<'py, PyAny>> {
    obj.getattr(name).map_err(|_| {
        PlanError::new(format!(
            "expected an object with a {name:?} field, got {}",
            type_name(obj)
        ))
    })
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "an unknown type".to_owned(), |n| n.to_string())
}

/// A Python int (not a bool) in [0, 2^63).
fn to_u64(value: &Bound<'_, PyAny>, name: &str) -> Converted<u64> {
    let refuse = || {
        let shown = value
            .repr()
            .map_or_else(|_| "?".to_owned(), |r| r.to_string());
        PlanError::new(format!(
            "{name} must be an integer in [0, 2^63), got {shown} ({})",
            type_name(value)
        ))
    };
    if value.is_instance_of::<PyBool>() {
        return Err(refuse());
    }
    match value.extract::<u64>() {
        Ok(number) if number <= MAX_VALUE => Ok(number),
        _ => Err(refuse()),
    }
}

fn field_u64(obj: &Bound<'_, PyAny>, name: &str) -> Converted<u64> {
    to_u64(&attr(obj, name)?, name)
}

fn field_str(obj: &Bound<'_, PyAny>, name: &str) -> Converted<String> {
    let value = attr(obj, name)?;
    // Enum members of `str` subclasses extract as their value.
    value.extract::<String>().map_err(|_| {
        PlanError::new(format!(
            "{name} must be a string, got {} ({})",
            value
                .repr()
                .map_or_else(|_| "?".to_owned(), |r| r.to_string()),
            type_name(&value)
        ))
    })
}

fn parallel_layout(obj: &Bound<'_, PyAny>) -> Converted<ParallelLayout> {
    ParallelLayout::new(
        Role::parse(&field_str(obj, "role")?)?,
        field_u64(obj, "world_size")?,
        field_u64(obj, "dp_size")?,
    )
}

fn buffer_layout(obj: &Bound<'_, PyAny>) -> Converted<BufferLayout> {
    let buffer = BufferLayout {
        buffer_index: field_u64(obj, "buffer_index")?,
        buffer_kind: BufferKind::parse(&field_str(obj, "buffer_kind")?)?,
        logical_axis: LogicalAxis::parse(&field_str(obj, "logical_axis")?)?,
        logical_size: field_u64(obj, "logical_size")?,
        page_size: field_u64(obj, "page_size")?,
        bytes_per_logical_unit: field_u64(obj, "bytes_per_logical_unit")?,
        item_stride_bytes: field_u64(obj, "item_stride_bytes")?,
        tp_replica_group_size: field_u64(obj, "tp_replica_group_size")?,
    };
    buffer.validate()?;
    Ok(buffer)
}

fn fragment(obj: &Bound<'_, PyAny>) -> Converted<Fragment> {
    let page_count = attr(obj, "page_count")?;
    let fragment = Fragment {
        buffer_index: field_u64(obj, "buffer_index")?,
        buffer_kind: BufferKind::parse(&field_str(obj, "buffer_kind")?)?,
        src_rank: field_u64(obj, "src_rank")?,
        dst_rank: field_u64(obj, "dst_rank")?,
        src_page_stride_bytes: field_u64(obj, "src_page_stride_bytes")?,
        dst_page_stride_bytes: field_u64(obj, "dst_page_stride_bytes")?,
        src_byte_offset: field_u64(obj, "src_byte_offset")?,
        dst_byte_offset: field_u64(obj, "dst_byte_offset")?,
        bytes_per_page: field_u64(obj, "bytes_per_page")?,
        page_count: if page_count.is_none() {
            None
        } else {
            Some(to_u64(&page_count, "page_count")?)
        },
    };
    fragment.validate()?;
    Ok(fragment)
}

fn each<T>(
    items: &Bound<'_, PyAny>,
    what: &str,
    convert: fn(&Bound<'_, PyAny>) -> Converted<T>,
) -> Converted<Vec<T>> {
    let iter = items.try_iter().map_err(|_| {
        PlanError::new(format!(
            "{what} must be a sequence, got {}",
            type_name(items)
        ))
    })?;
    let mut out = Vec::new();
    for (position, item) in iter.enumerate() {
        let item = item.map_err(|e| PlanError::new(format!("{what}: {e}")))?;
        let converted = convert(&item)
            .map_err(|e| PlanError::new(format!("{what}[{position}]: {}", e.message())))?;
        out.push(converted);
    }
    Ok(out)
}

fn frame<'a>(value: &'a Bound<'_, PyAny>, name: &str) -> Converted<Option<&'a [u8]>> {
    if value.is_none() {
        return Ok(None);
    }
    value
        .cast::<PyBytes>()
        .map(|b| Some(b.as_bytes()))
        .map_err(|_| {
            PlanError::new(format!(
                "{name} must be bytes or None, got {}",
                type_name(value)
            ))
        })
}

// ---------------------------------------------------------------------------------------------
// core -> Python

/// The dataclasses of `pdplan._model`, imported once.
struct ModelTypes {
    fragment: Py<PyType>,
    rank_plan: Py<PyType>,
    /// `BufferKind` members in `BufferKind::ALL` order.
    kinds: Vec<Py<PyAny>>,
    object_new: Py<PyAny>,
}

static MODEL_TYPES: PyOnceLock<ModelTypes> = PyOnceLock::new();

fn model_types(py: Python<'_>) -> PyResult<&ModelTypes> {
    MODEL_TYPES.get_or_try_init(py, || {
        let model = py.import("pdplan._model")?;
        let kind_type = model.getattr("BufferKind")?;
        let kinds = BufferKind::ALL
            .iter()
            .map(|kind| kind_type.call1((kind.as_str(),)).map(Bound::unbind))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(ModelTypes {
            fragment: model
                .getattr("TransferFragment")?
                .cast_into::<PyType>()?
                .unbind(),
            rank_plan: model
                .getattr("RankTransferPlan")?
                .cast_into::<PyType>()?
                .unbind(),
            kinds,
            object_new: py
                .import("builtins")?
                .getattr("object")?
                .getattr("__new__")?
                .unbind(),
        })
    })
}

fn kind_object<'py>(py: Python<'py>, types: &ModelTypes, kind: BufferKind) -> Bound<'py, PyAny> {
    let position = BufferKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
    types.kinds[position].bind(py).clone()
}

/// A `TransferFragment` built without running `__init__`: the values come validated from the
/// core, and skipping the frozen-dataclass setters makes large plans several times cheaper.
fn fragment_object<'py>(
    py: Python<'py>,
    types: &ModelTypes,
    f: &Fragment,
) -> PyResult<Bound<'py, PyAny>> {
    let obj = types
        .object_new
        .bind(py)
        .call1((types.fragment.bind(py),))?;
    let dict = obj
        .getattr(intern!(py, "__dict__"))?
        .cast_into::<PyDict>()?;
    dict.set_item(intern!(py, "buffer_index"), f.buffer_index)?;
    dict.set_item(
        intern!(py, "buffer_kind"),
        kind_object(py, types, f.buffer_kind),
    )?;
    dict.set_item(intern!(py, "src_rank"), f.src_rank)?;
    dict.set_item(intern!(py, "dst_rank"), f.dst_rank)?;
    dict.set_item(
        intern!(py, "src_page_stride_bytes"),
        f.src_page_stride_bytes,
    )?;
    dict.set_item(
        intern!(py, "dst_page_stride_bytes"),
        f.dst_page_stride_bytes,
    )?;
    dict.set_item(intern!(py, "src_byte_offset"), f.src_byte_offset)?;
    dict.set_item(intern!(py, "dst_byte_offset"), f.dst_byte_offset)?;
    dict.set_item(intern!(py, "bytes_per_page"), f.bytes_per_page)?;
    dict.set_item(intern!(py, "page_count"), f.page_count)?;
    Ok(obj)
}

fn fragment_tuple<'py>(
    py: Python<'py>,
    types: &ModelTypes,
    fragments: &[Fragment],
) -> PyResult<Bound<'py, PyTuple>> {
    let objects = fragments
        .iter()
        .map(|f| fragment_object(py, types, f))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, objects)
}

fn rank_plan_object<'py>(py: Python<'py>, plan: &RankPlan) -> PyResult<Bound<'py, PyAny>> {
    let types = model_types(py)?;
    let fragments = PyDict::new(py);
    let fanouts = PyDict::new(py);
    let mut ranks = Vec::with_capacity(plan.sources.len());
    for source in &plan.sources {
        ranks.push(source.prefill_rank);
        if plan.kind == crate::planner::PlanKind::Fragmented {
            fragments.set_item(
                source.prefill_rank,
                fragment_tuple(py, types, &source.fragments)?,
            )?;
        }
        fanouts.set_item(source.prefill_rank, source.fanout)?;
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item("plan_kind", plan.kind.as_str())?;
    kwargs.set_item("target_dp_group", plan.target_dp_group)?;
    kwargs.set_item("target_prefill_ranks", PyTuple::new(py, &ranks)?)?;
    kwargs.set_item("required_prefill_response_num", ranks.len())?;
    kwargs.set_item("fragments_by_prefill_rank", fragments)?;
    kwargs.set_item("required_dst_info_num_by_prefill_rank", fanouts)?;
    types.rank_plan.bind(py).call((), Some(&kwargs))
}

// ---------------------------------------------------------------------------------------------
// exposed functions and classes

/// Validates a `ParallelLayout` (called from its `__post_init__`).
#[pyfunction]
fn check_parallel_layout(layout: &Bound<'_, PyAny>) -> PyResult<()> {
    parallel_layout(layout).map(|_| ()).map_err(to_py_err)
}

/// Validates a `BufferLayout` (called from its `__post_init__`).
#[pyfunction]
fn check_buffer_layout(buffer: &Bound<'_, PyAny>) -> PyResult<()> {
    buffer_layout(buffer).map(|_| ()).map_err(to_py_err)
}

/// Validates a `TransferFragment` (called from its `__post_init__`).
#[pyfunction]
fn check_transfer_fragment(fragment_obj: &Bound<'_, PyAny>) -> PyResult<()> {
    fragment(fragment_obj).map(|_| ()).map_err(to_py_err)
}

#[pyfunction]
fn encode_transfer_fragments<'py>(
    py: Python<'py>,
    fragments: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let fragments = each(fragments, "fragments", fragment).map_err(to_py_err)?;
    let (version, payload) = py.detach(|| wire::encode(&fragments));
    Ok((PyBytes::new(py, &version), PyBytes::new(py, &payload)))
}

#[pyfunction]
#[pyo3(signature = (version_frame, payload_frame))]
fn decode_transfer_fragments<'py>(
    py: Python<'py>,
    version_frame: &Bound<'py, PyAny>,
    payload_frame: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let version = frame(version_frame, "version_frame").map_err(to_py_err)?;
    let payload = frame(payload_frame, "payload_frame").map_err(to_py_err)?;
    // Owned copies so the GIL can be released while parsing.
    let (version, payload) = (version.map(<[u8]>::to_vec), payload.map(<[u8]>::to_vec));
    let fragments = py
        .detach(|| wire::decode(version.as_deref(), payload.as_deref()))
        .map_err(to_py_err)?;
    fragment_tuple(py, model_types(py)?, &fragments)
}

/// The compiled planner behind `pdplan.PDTransferPlanner`.
#[pyclass(frozen, module = "pdplan._core", name = "Planner")]
struct PyPlanner {
    inner: Planner,
}

#[pymethods]
impl PyPlanner {
    #[new]
    fn new(
        py: Python<'_>,
        prefill_layout: &Bound<'_, PyAny>,
        decode_layout: &Bound<'_, PyAny>,
        prefill_buffers: &Bound<'_, PyAny>,
        decode_buffers: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let convert = || -> Converted<_> {
            Ok((
                parallel_layout(prefill_layout)?,
                parallel_layout(decode_layout)?,
                each(prefill_buffers, "prefill_buffers", buffer_layout)?,
                each(decode_buffers, "decode_buffers", buffer_layout)?,
            ))
        };
        let (prefill, decode, prefill_buffers, decode_buffers) = convert().map_err(to_py_err)?;
        let inner = py
            .detach(|| Planner::new(prefill, decode, &prefill_buffers, &decode_buffers))
            .map_err(to_py_err)?;
        Ok(Self { inner })
    }

    fn plan_for_decode_rank<'py>(
        &self,
        py: Python<'py>,
        decode_rank: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let rank = to_u64(decode_rank, "decode_rank").map_err(|_| {
            to_py_err(PlanError::new(format!(
                "decode_rank={} is out of range: the decode world has {} ranks (0..{})",
                decode_rank
                    .repr()
                    .map_or_else(|_| "?".to_owned(), |r| r.to_string()),
                self.inner.decode().world_size,
                self.inner.decode().world_size
            )))
        })?;
        let plan = py
            .detach(|| self.inner.plan_for_decode_rank(rank))
            .map_err(to_py_err)?;
        rank_plan_object(py, &plan)
    }

    /// Fanout of every prefill rank, in rank order.
    fn source_fanout<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (rank, fanout) in self.inner.source_fanout() {
            dict.set_item(rank, fanout)?;
        }
        Ok(dict)
    }

    #[getter]
    fn is_identity(&self) -> bool {
        self.inner.is_identity()
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add(
        "UnsupportedPDLayoutError",
        py.get_type::<UnsupportedPDLayoutError>(),
    )?;
    m.add("TRANSFER_PLAN_PROTOCOL_VERSION", wire::PROTOCOL_VERSION)?;
    m.add("MAX_WORLD_SIZE", crate::layout::MAX_WORLD_SIZE)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyPlanner>()?;
    m.add_function(wrap_pyfunction!(check_parallel_layout, m)?)?;
    m.add_function(wrap_pyfunction!(check_buffer_layout, m)?)?;
    m.add_function(wrap_pyfunction!(check_transfer_fragment, m)?)?;
    m.add_function(wrap_pyfunction!(encode_transfer_fragments, m)?)?;
    m.add_function(wrap_pyfunction!(decode_transfer_fragments, m)?)?;
    Ok(())
}
