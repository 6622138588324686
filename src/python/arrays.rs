//! An array's metadata through the protocols runtimes' tensors speak: `__cuda_array_interface__`
//! (`CuPy`, torch on CUDA), `__array_interface__` (numpy), `__dlpack__` (torch, `CuPy`, numpy). No
//! copy and no import of torch; the memory, which may sit on a device, is never read.

use std::ffi::{c_void, CStr};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::array_interface::{self, DlDtype};
use crate::array_layout::{self, ArraySpec, ArrayView, Axis};
use crate::error::{bail, PlanError};
use crate::layout::{BufferKind, LogicalParts};
use crate::limits;

use super::convert::{each, optional_u64, string_arg, to_u64, type_name, Converted};
use super::objects::buffer_layout_object;
use super::to_py_err;

/// `pdplan.buffer_from_array`: the `BufferLayout` a runtime's cache array holds, with its base
/// address and the bytes its view reaches.
#[pyfunction]
#[pyo3(signature = (buffer_index, buffer_kind, array, axes, *, logical_size=None, tp_size=None, page_size=None, layer=None, sliding_window=None, attention_chunk_size=None, logical_parts=None, logical_part_groups=None))]
#[allow(clippy::too_many_arguments)]
pub fn buffer_from_array<'py>(
    py: Python<'py>,
    buffer_index: &Bound<'py, PyAny>,
    buffer_kind: &Bound<'py, PyAny>,
    array: &Bound<'py, PyAny>,
    axes: &Bound<'py, PyAny>,
    logical_size: Option<&Bound<'py, PyAny>>,
    tp_size: Option<&Bound<'py, PyAny>>,
    page_size: Option<&Bound<'py, PyAny>>,
    layer: Option<&Bound<'py, PyAny>>,
    sliding_window: Option<&Bound<'py, PyAny>>,
    attention_chunk_size: Option<&Bound<'py, PyAny>>,
    logical_parts: Option<&Bound<'py, PyAny>>,
    logical_part_groups: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyAny>, u64, u64)> {
    let convert = || -> Converted<_> {
        if axes.is_instance_of::<pyo3::types::PyString>() {
            bail!("axes must be a sequence of axis names, one a dimension, not one string");
        }
        let names = each(axes, "axes", &crate::limits::ARRAY_AXES, |a| {
            Axis::parse(&string_arg(a, "an axis name")?)
        })?;
        let counts = |list: &Bound<'py, PyAny>, what: &str| {
            each(list, what, &crate::limits::PARTS, |v| to_u64(v, "a part"))
        };
        let groups = logical_part_groups.filter(|g| !g.is_none());
        let parts = match (logical_parts.filter(|p| !p.is_none()), groups) {
            (None, None) => LogicalParts::WHOLE,
            (None, Some(_)) => {
                bail!("logical_part_groups names the groups of logical_parts; give logical_parts")
            }
            (Some(p), None) => LogicalParts::new(&counts(p, "logical_parts")?)?,
            (Some(p), Some(g)) => LogicalParts::new(&counts(p, "logical_parts")?)?
                .with_groups(&counts(g, "logical_part_groups")?)?,
        };
        let spec = ArraySpec {
            buffer_index: to_u64(buffer_index, "buffer_index")?,
            buffer_kind: BufferKind::parse(&string_arg(buffer_kind, "buffer_kind")?)?,
            logical_size: optional_u64(logical_size, "logical_size")?,
            tp_size: optional_u64(tp_size, "tp_size")?.unwrap_or(1),
            page_size: optional_u64(page_size, "page_size")?,
            layer: optional_u64(layer, "layer")?,
            sliding_window: optional_u64(sliding_window, "sliding_window")?,
            attention_chunk_size: optional_u64(attention_chunk_size, "attention_chunk_size")?,
            logical_parts: parts,
        };
        array_layout::buffer_from_array(&array_view(array)?, &names, &spec)
    };
    let built = convert().map_err(to_py_err)?;
    Ok((
        buffer_layout_object(py, &built.layout)?,
        built.base,
        built.limit,
    ))
}

/// The metadata of `array`, through the first protocol it speaks.
pub fn array_view(array: &Bound<'_, PyAny>) -> Converted<ArrayView> {
    for name in ["__cuda_array_interface__", "__array_interface__"] {
        // A tensor may have the attribute yet refuse it (torch's bfloat16): try the next.
        if let Ok(interface) = array.getattr(name) {
            if let Ok(interface) = interface.cast_into::<PyDict>() {
                return interface_view(&interface, name);
            }
        }
    }
    if array.hasattr("__dlpack__").unwrap_or(false) {
        return dlpack_view(array);
    }
    bail!(
        "expected an array (with __dlpack__, __cuda_array_interface__ or __array_interface__), \
         got {}",
        type_name(array)
    )
}

fn item<'py>(dict: &Bound<'py, PyDict>, key: &str, name: &str) -> Converted<Bound<'py, PyAny>> {
    dict.get_item(key)
        .ok()
        .flatten()
        .ok_or_else(|| PlanError::new(format!("{name} has no {key:?}")))
}

fn ints(value: &Bound<'_, PyAny>, what: &str) -> Converted<Vec<i64>> {
    let tuple = value
        .cast::<PyTuple>()
        .map_err(|_| PlanError::new(format!("{what} must be a tuple")))?;
    limits::ARRAY_AXES.check(&format!("{what}'s dimensions"), tuple.len() as u64)?;
    tuple
        .iter()
        .map(|v| {
            v.extract::<i64>()
                .map_err(|_| PlanError::new(format!("{what} holds a non-integer")))
        })
        .collect()
}

fn interface_view(dict: &Bound<'_, PyDict>, name: &str) -> Converted<ArrayView> {
    let shape = ints(&item(dict, "shape", name)?, "shape")?;
    let typestr: String = item(dict, "typestr", name)?
        .extract()
        .map_err(|_| PlanError::new(format!("{name}'s typestr must be a string")))?;
    let data = item(dict, "data", name)?;
    let address = data
        .cast::<PyTuple>()
        .ok()
        .and_then(|t| t.get_item(0).ok())
        .and_then(|p| p.extract::<u64>().ok())
        .ok_or_else(|| {
            PlanError::new(format!(
                "{name}'s data must be (address, read-only); the array exposes no address"
            ))
        })?;
    let strides = match dict.get_item("strides").ok().flatten() {
        Some(s) if !s.is_none() => Some(ints(&s, "strides")?),
        _ => None,
    };
    array_interface::interface_view(address, &shape, strides, &typestr)
}

/// `DLPack`'s `DLTensor`, as `dlpack.h` lays it out (ABI stable since v0.2). The device
/// fields are never read (the memory is never touched) but hold their place in the layout.
#[repr(C)]
#[allow(dead_code)]
struct DlTensor {
    data: *mut c_void,
    device_type: i32,
    device_id: i32,
    ndim: i32,
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

const DLTENSOR: &CStr = c"dltensor";

fn dlpack_view(array: &Bound<'_, PyAny>) -> Converted<ArrayView> {
    let capsule = array.call_method0("__dlpack__").map_err(|e| {
        PlanError::new(format!(
            "the array's __dlpack__() failed ({e}); pass a tensor that exports itself"
        ))
    })?;
    // SAFETY: `capsule` is a live object for the whole call; `PyCapsule_IsValid` only reads
    // its type and name and returns 0 (no error set) for anything but a capsule so named.
    let valid = unsafe { ffi::PyCapsule_IsValid(capsule.as_ptr(), DLTENSOR.as_ptr()) };
    if valid == 0 {
        bail!("__dlpack__() did not return an unconsumed \"dltensor\" capsule");
    }
    // SAFETY: the capsule is valid under that name (checked above), so this returns its
    // non-null pointer, a `DLManagedTensor` whose first member is the `DLTensor`; the
    // producer keeps it alive until the capsule (held here) is destroyed.
    let tensor = unsafe {
        ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr()).cast::<DlTensor>()
    };
    if tensor.is_null() {
        bail!("__dlpack__() returned an empty capsule");
    }
    // SAFETY: `tensor` points at the producer's live `DLTensor` (see above); it is only read.
    let t = unsafe { &*tensor };
    let ndim = u64::try_from(t.ndim).unwrap_or(u64::MAX);
    limits::ARRAY_AXES.check("the DLPack tensor's dimensions", ndim)?;
    if t.shape.is_null() {
        bail!("the DLPack tensor has no shape");
    }
    #[allow(clippy::cast_possible_truncation)] // at most MAX_ARRAY_AXES
    let ndim = ndim as usize;
    // SAFETY: `shape` is non-null (checked) and, per DLPack, holds `ndim` int64 values owned
    // by the live tensor.
    let shape = unsafe { std::slice::from_raw_parts(t.shape, ndim) };
    // SAFETY: a non-null `strides` holds `ndim` int64 values (in elements), as `shape`.
    let strides =
        (!t.strides.is_null()).then(|| unsafe { std::slice::from_raw_parts(t.strides, ndim) });
    let dtype = DlDtype {
        code: t.dtype_code,
        bits: t.dtype_bits,
        lanes: t.dtype_lanes,
    };
    array_interface::dlpack_view(t.data as u64, t.byte_offset, shape, strides, dtype)
}
