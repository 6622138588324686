//! Layout frames (`encode_layout`, `decode_layout`): one side's layout and buffers, exchanged
//! once, as `layout_frame` codes them.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::convert::{
    buffer_column, buffer_layout, each, frame, optional_u64, parallel_layout, Converted,
};
use super::objects::buffer_layout_object;
use super::to_py_err;
use crate::error::bail;
use crate::layout_frame::{self, DEFAULT_MAX_LAYOUT_BYTES};

/// A column of addresses or limits, or `None`.
fn column(value: Option<&Bound<'_, PyAny>>, name: &str) -> Converted<Option<Vec<u64>>> {
    value
        .filter(|v| !v.is_none())
        .map(|v| buffer_column(v, name))
        .transpose()
}

#[pyfunction]
#[pyo3(signature = (layout, buffers, *, base_ptrs=None, limits=None))]
pub fn encode_layout<'py>(
    py: Python<'py>,
    layout: &Bound<'py, PyAny>,
    buffers: &Bound<'py, PyAny>,
    base_ptrs: Option<&Bound<'py, PyAny>>,
    limits: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let convert = || -> Converted<_> {
        let layout = parallel_layout(layout)?;
        let buffers = each(
            buffers,
            "buffers",
            &crate::limits::LAYOUT_BUFFERS,
            buffer_layout,
        )?;
        let bases = column(base_ptrs, "base_ptrs")?;
        let limits = column(limits, "limits")?;
        layout_frame::encode(&layout, &buffers, bases.as_deref(), limits.as_deref())
    };
    let (version, payload) = convert().map_err(to_py_err)?;
    Ok((PyBytes::new(py, &version), PyBytes::new(py, &payload)))
}

/// The decoded frame: the layout's fields in dataclass order (for `ParallelLayout(*fields)`),
/// the buffers, and the base pointers and limits (or `None`).
type Decoded<'py> = (
    Bound<'py, PyTuple>,
    Bound<'py, PyTuple>,
    Option<Vec<u64>>,
    Option<Vec<u64>>,
);

#[pyfunction]
#[pyo3(signature = (version_frame, payload_frame, *, max_payload_bytes=None))]
pub fn decode_layout<'py>(
    py: Python<'py>,
    version_frame: &Bound<'py, PyAny>,
    payload_frame: &Bound<'py, PyAny>,
    max_payload_bytes: Option<&Bound<'py, PyAny>>,
) -> PyResult<Decoded<'py>> {
    let convert = || -> Converted<_> {
        let limit = optional_u64(max_payload_bytes, "max_payload_bytes")?
            .unwrap_or(DEFAULT_MAX_LAYOUT_BYTES);
        let (Some(version), Some(payload)) = (
            frame(version_frame, "version_frame")?,
            frame(payload_frame, "payload_frame")?,
        ) else {
            bail!("incomplete layout frames: both the version and the payload frame are needed");
        };
        // Bounded on its length before anything is parsed.
        if payload.len() as u64 > limit {
            return layout_frame::decode(version, payload, limit);
        }
        py.detach(|| layout_frame::decode(version, payload, limit))
    };
    let decoded = convert().map_err(to_py_err)?;
    let l = &decoded.layout;
    let c = l.context();
    let partition = l
        .pp_layer_partition()
        .map(|stages| PyTuple::new(py, stages))
        .transpose()?;
    let fields = (
        l.role().as_str(),
        l.world_size(),
        l.dp_size(),
        l.pp_size(),
        partition,
        c.cp_size,
        c.dcp_size,
        c.kv.as_str(),
        c.split.as_str(),
        c.interleave,
    )
        .into_pyobject(py)?;
    let buffers = decoded
        .buffers
        .iter()
        .map(|b| buffer_layout_object(py, b))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((
        fields,
        PyTuple::new(py, buffers)?,
        decoded.base_ptrs,
        decoded.limits,
    ))
}
