//! The model entry points: buffer layouts from a model shape or from item lengths, shapes from a
//! config or a preset, dtypes, vLLM's layer partition. Arguments are checked for their Python
//! types here; every rule is the core's (`crate::model`, `crate::stages`).

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::convert::{each, item_lengths, model_shape, string_arg, to_u64, Converted};
use super::objects::buffer_layout_object;
use super::to_py_err;
use crate::layout::BufferLayout;
use crate::model;
use crate::stages;

/// Both sides' layouts as two tuples of `BufferLayout`.
fn layout_tuples(
    py: Python<'_>,
    (prefill, decode): (Vec<BufferLayout>, Vec<BufferLayout>),
) -> PyResult<(Bound<'_, PyTuple>, Bound<'_, PyTuple>)> {
    let side = |buffers: &[BufferLayout]| {
        let objects = buffers
            .iter()
            .map(|b| buffer_layout_object(py, b))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, objects)
    };
    Ok((side(&prefill)?, side(&decode)?))
}

/// Both sides' buffers for a model shape at two TP sizes (and pipeline stage counts).
#[pyfunction]
#[pyo3(signature = (shape, prefill_tp, decode_tp, kv_layout=None, prefill_stages=None, decode_stages=None))]
fn model_buffers<'py>(
    py: Python<'py>,
    shape: &Bound<'py, PyAny>,
    prefill_tp: &Bound<'py, PyAny>,
    decode_tp: &Bound<'py, PyAny>,
    kv_layout: Option<&Bound<'py, PyAny>>,
    prefill_stages: Option<&Bound<'py, PyAny>>,
    decode_stages: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyTuple>)> {
    let pp = |value: Option<&Bound<'py, PyAny>>, name| value.map_or(Ok(1), |v| to_u64(v, name));
    let convert = || -> Converted<_> {
        let kv_layout = match kv_layout {
            None => model::KvLayout::Hnd,
            Some(value) => model::KvLayout::parse(&string_arg(value, "kv_layout")?)?,
        };
        Ok((
            model_shape(shape)?,
            (
                to_u64(prefill_tp, "prefill_tp")?,
                to_u64(decode_tp, "decode_tp")?,
            ),
            (
                pp(prefill_stages, "prefill_pp")?,
                pp(decode_stages, "decode_pp")?,
            ),
            kv_layout,
        ))
    };
    let (shape, tp, pp, kv_layout) = convert().map_err(to_py_err)?;
    let buffers = py
        .detach(|| model::pair_buffers(&shape, tp, pp, kv_layout))
        .map_err(to_py_err)?;
    layout_tuples(py, buffers)
}

/// Both sides' buffers inferred from per-rank item and unit byte lengths.
#[pyfunction]
fn buffers_from_item_lengths<'py>(
    py: Python<'py>,
    items: &Bound<'py, PyAny>,
    prefill_tp: &Bound<'py, PyAny>,
    decode_tp: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyTuple>)> {
    let convert = || -> Converted<_> {
        Ok((
            each(items, "items", item_lengths)?,
            to_u64(prefill_tp, "prefill_tp")?,
            to_u64(decode_tp, "decode_tp")?,
        ))
    };
    let (items, prefill_tp, decode_tp) = convert().map_err(to_py_err)?;
    let pairs = items
        .iter()
        .map(|item| model::from_item_lengths(item, prefill_tp, decode_tp))
        .collect::<Result<Vec<_>, _>>()
        .map_err(to_py_err)?;
    layout_tuples(py, pairs.into_iter().unzip())
}

/// The dtype name and the integer shape fields of a Hugging Face `config.json` text, or of a
/// preset.
#[pyfunction]
#[pyo3(signature = (config_text=None, preset=None, page_size=None))]
fn model_shape_fields(
    config_text: Option<&Bound<'_, PyAny>>,
    preset: Option<&Bound<'_, PyAny>>,
    page_size: Option<&Bound<'_, PyAny>>,
) -> PyResult<(&'static str, Vec<(&'static str, u64)>)> {
    let shape = || -> Converted<model::ModelShape> {
        let page_size = page_size.map_or(Ok(16), |v| to_u64(v, "page_size"))?;
        let config = config_text
            .map(|v| string_arg(v, "config_text"))
            .transpose()?;
        let name = preset.map(|v| string_arg(v, "preset")).transpose()?;
        model::shape_from(config.as_deref(), name.as_deref(), page_size)
    };
    let shape = shape().map_err(to_py_err)?;
    Ok((shape.dtype.as_str(), shape_fields(&shape)))
}

fn shape_fields(s: &model::ModelShape) -> Vec<(&'static str, u64)> {
    let mla = s.mla.unwrap_or_default();
    let mamba = s.mamba.unwrap_or_default();
    let conv = mamba.conv.unwrap_or_default();
    let draft = s.draft.unwrap_or_default();
    vec![
        ("layers", s.layers),
        ("kv_heads", s.kv_heads),
        ("head_dim", s.head_dim),
        ("page_size", s.page_size),
        ("mla_kv_lora_rank", mla.kv_lora_rank),
        ("mla_rope_head_dim", mla.rope_head_dim),
        ("mamba_layers", mamba.layers),
        ("mamba_channels", mamba.channels),
        ("mamba_bytes_per_channel", mamba.bytes_per_channel),
        ("mamba_conv_x_channels", conv.x_channels),
        ("mamba_conv_bc_channels", conv.bc_channels),
        ("mamba_conv_width", conv.width),
        ("draft_layers", draft.layers),
        ("draft_kv_heads", draft.kv_heads),
        ("draft_head_dim", draft.head_dim),
    ]
}

/// vLLM's default layer partition over pipeline stages.
#[pyfunction]
fn vllm_layer_partition(
    layers: &Bound<'_, PyAny>,
    pp_size: &Bound<'_, PyAny>,
) -> PyResult<Vec<u64>> {
    let convert = || -> Converted<_> {
        stages::vllm_partition(to_u64(layers, "layers")?, to_u64(pp_size, "pp_size")?)
    };
    convert().map_err(to_py_err)
}

/// Bytes of one element of a dtype name.
#[pyfunction]
fn dtype_bytes(name: &Bound<'_, PyAny>) -> PyResult<u64> {
    let convert = || -> Converted<_> { model::dtype_bytes(&string_arg(name, "dtype")?) };
    convert().map_err(to_py_err)
}

/// Adds the model entry points to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(model_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(buffers_from_item_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(model_shape_fields, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(vllm_layer_partition, m)?)?;
    m.add("MODEL_PRESETS", model::PRESET_NAMES.to_vec())?;
    Ok(())
}
