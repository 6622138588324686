//! The model entry points: buffer layouts from a model shape or from item lengths, shapes from a
//! config or a preset, dtypes, vLLM's layer partition. Arguments are checked for their Python
//! types here; every rule is the core's (`crate::model`, `crate::stages`).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::convert::{each, item_lengths, model_shape, string_arg, to_u64, Converted};
use super::objects::buffer_layout_object;
use super::package_types::package_type;
use super::to_py_err;
use crate::layout::{BufferLayout, ContextParallel};
use crate::model::{self, KindType, KindValue};
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
#[pyo3(signature = (shape, prefill_tp, decode_tp, kv_layout=None, prefill_stages=None, decode_stages=None, prefill_cp=None, prefill_dcp=None, decode_cp=None, decode_dcp=None))]
#[allow(clippy::too_many_arguments, clippy::similar_names)] // the Python function's arguments
fn model_buffers<'py>(
    py: Python<'py>,
    shape: &Bound<'py, PyAny>,
    prefill_tp: &Bound<'py, PyAny>,
    decode_tp: &Bound<'py, PyAny>,
    kv_layout: Option<&Bound<'py, PyAny>>,
    prefill_stages: Option<&Bound<'py, PyAny>>,
    decode_stages: Option<&Bound<'py, PyAny>>,
    prefill_cp: Option<&Bound<'py, PyAny>>,
    prefill_dcp: Option<&Bound<'py, PyAny>>,
    decode_cp: Option<&Bound<'py, PyAny>>,
    decode_dcp: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyTuple>)> {
    let pp = |value: Option<&Bound<'py, PyAny>>, name| value.map_or(Ok(1), |v| to_u64(v, name));
    let context = |cp, dcp| -> Converted<ContextParallel> {
        Ok(ContextParallel {
            cp_size: pp(cp, "cp_size")?,
            dcp_size: pp(dcp, "dcp_size")?,
            ..ContextParallel::NONE
        })
    };
    let contexts = [
        context(prefill_cp, prefill_dcp).map_err(to_py_err)?,
        context(decode_cp, decode_dcp).map_err(to_py_err)?,
    ];
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
        .detach(|| model::pair_buffers(&shape, tp, pp, kv_layout, contexts))
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
            each(items, "items", &crate::limits::LAYOUT_BUFFERS, item_lengths)?,
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

/// A layer as its Python class (`pdplan._layouts`), built with keywords from its schema row.
fn layer_object<'py>(py: Python<'py>, layer: &model::Layer) -> PyResult<Bound<'py, PyAny>> {
    let kind = layer.schema();
    let kwargs = PyDict::new(py);
    for (field, value) in kind.fields.iter().zip(layer.values()) {
        match value {
            KindValue::Int(v) => kwargs.set_item(field.name, v)?,
            KindValue::OptionalInt(v) => kwargs.set_item(field.name, v)?,
            KindValue::Layer(part) => kwargs.set_item(field.name, layer_object(py, &part)?)?,
        }
    }
    package_type(py, kind.class)?.call((), Some(&kwargs))
}

/// The layer-kind schema, for the parity test and the docs: per kind (kind, class, what it
/// keeps, fields as (name, type, default, doc)); a type is `int`, `int | None` or the kind of a
/// part layer.
fn layer_kinds(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let rows = PyList::empty(py);
    for kind in model::LAYER_KINDS {
        let fields = PyList::empty(py);
        for field in kind.fields {
            let (ty, default) = match field.ty {
                KindType::Int(default) => ("int", default),
                KindType::OptionalInt => ("int | None", None),
                KindType::Layer(part) => (part, None),
            };
            fields.append((field.name, ty, default, field.doc))?;
        }
        rows.append((kind.kind, kind.class, kind.keeps, fields))?;
    }
    Ok(rows)
}

/// The layers of a shape as layer objects; kinds repeat as the same object.
fn layer_objects<'py>(py: Python<'py>, layers: &[model::Layer]) -> PyResult<Bound<'py, PyTuple>> {
    let mut made: Vec<(model::Layer, Bound<'py, PyAny>)> = Vec::new();
    let mut out = Vec::with_capacity(layers.len());
    for layer in layers {
        if let Some((_, object)) = made.iter().find(|(l, _)| l == layer) {
            out.push(object.clone());
            continue;
        }
        let object = layer_object(py, layer)?;
        made.push((*layer, object.clone()));
        out.push(object);
    }
    PyTuple::new(py, out)
}

/// A shape's dtype, layer objects, draft model (layers, KV heads, head dim), KV cache and
/// state dtypes, and family.
type ShapeParts<'py> = (
    &'static str,
    Bound<'py, PyTuple>,
    (u64, u64, u64),
    (Option<&'static str>, Option<&'static str>),
    Option<&'static str>,
    u64,
);

/// A config's or a preset's shape, as the parts `ModelShape` is built of: its dtype, its
/// layers and its draft model (layers, KV heads, head dim). `quant_config_text`: `ModelOpt`'s
/// `hf_quant_config.json` beside the config, where there is one.
#[pyfunction]
#[pyo3(signature = (config_text=None, preset=None, page_size=None, family=None, quant_config_text=None))]
fn model_shape_parts<'py>(
    py: Python<'py>,
    config_text: Option<&Bound<'py, PyAny>>,
    preset: Option<&Bound<'py, PyAny>>,
    page_size: Option<&Bound<'py, PyAny>>,
    family: Option<&Bound<'py, PyAny>>,
    quant_config_text: Option<&Bound<'py, PyAny>>,
) -> PyResult<ShapeParts<'py>> {
    let shape = || -> Converted<model::ModelShape> {
        let page_size = page_size
            .filter(|v| !v.is_none())
            .map(|v| to_u64(v, "page_size"))
            .transpose()?;
        let config = config_text
            .map(|v| string_arg(v, "config_text"))
            .transpose()?;
        let quant = quant_config_text
            .map(|v| string_arg(v, "quant_config_text"))
            .transpose()?;
        let name = preset.map(|v| string_arg(v, "preset")).transpose()?;
        let family = family.map(|v| string_arg(v, "family")).transpose()?;
        model::shape_from(
            config.as_deref(),
            quant.as_deref(),
            name.as_deref(),
            page_size,
            family.as_deref(),
        )
    };
    let shape = shape().map_err(to_py_err)?;
    let draft = shape.draft.unwrap_or_default();
    Ok((
        shape.dtype.as_str(),
        layer_objects(py, &shape.layers)?,
        (draft.layers, draft.kv_heads, draft.head_dim),
        (
            shape.kv_cache_dtype.map(model::Dtype::as_str),
            shape.state_dtype.map(model::Dtype::as_str),
        ),
        shape.family,
        shape.page_size,
    ))
}

/// One row per model family: (name, architectures, model types, cache keys read, source,
/// keys its modeling code never reads with the source that shows it).
type FamilyRow = (
    &'static str,
    Vec<&'static str>,
    Vec<&'static str>,
    Vec<&'static str>,
    &'static str,
    Vec<(&'static str, &'static str)>,
);

/// The registry of model families, in order.
#[pyfunction]
fn model_families() -> Vec<FamilyRow> {
    model::FAMILIES
        .iter()
        .map(|f| {
            (
                f.name,
                f.architectures.to_vec(),
                f.model_types.to_vec(),
                f.consumed_keys(),
                f.source,
                f.ignored.to_vec(),
            )
        })
        .collect()
}

/// A shape's layers, one object each (a uniform shape's expanded).
#[pyfunction]
fn model_layers<'py>(py: Python<'py>, shape: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
    let shape = model_shape(shape).map_err(to_py_err)?;
    layer_objects(py, &shape.layers)
}

/// One row per layer kind: (label, layers, bytes a token, bytes of state a request, window,
/// attention chunk, compress ratio, bytes a compressed entry).
type SummaryRow = (
    String,
    Vec<u64>,
    u64,
    u64,
    Option<u64>,
    Option<u64>,
    u64,
    u64,
);

/// The shape per layer kind, in order of first appearance (then the draft model).
#[pyfunction]
fn model_summary(shape: &Bound<'_, PyAny>) -> PyResult<Vec<SummaryRow>> {
    let convert = || -> Converted<_> { model::summarize(&model_shape(shape)?) };
    let kinds = convert().map_err(to_py_err)?;
    Ok(kinds
        .into_iter()
        .map(|k| {
            (
                k.label,
                k.layers,
                k.token_bytes,
                k.state_bytes,
                k.sliding_window,
                k.attention_chunk,
                k.compress_ratio,
                k.entry_bytes,
            )
        })
        .collect())
}

/// `layers` split over `pp_size` stages by `rule`.
fn partition(
    layers: &Bound<'_, PyAny>,
    pp_size: &Bound<'_, PyAny>,
    rule: fn(u64, u64) -> crate::error::PlanResult<Vec<u64>>,
) -> PyResult<Vec<u64>> {
    let convert =
        || -> Converted<_> { rule(to_u64(layers, "layers")?, to_u64(pp_size, "pp_size")?) };
    convert().map_err(to_py_err)
}

/// vLLM's default layer partition over pipeline stages.
#[pyfunction]
fn vllm_layer_partition(
    layers: &Bound<'_, PyAny>,
    pp_size: &Bound<'_, PyAny>,
) -> PyResult<Vec<u64>> {
    partition(layers, pp_size, stages::vllm_partition)
}

/// pdplan's default layer partition over pipeline stages.
#[pyfunction]
fn even_layer_partition(
    layers: &Bound<'_, PyAny>,
    pp_size: &Bound<'_, PyAny>,
) -> PyResult<Vec<u64>> {
    partition(layers, pp_size, stages::checked_even_partition)
}

/// The first token of an `n`-token request a buffer with this window or chunk keeps.
#[pyfunction]
#[pyo3(signature = (num_tokens, sliding_window=None, attention_chunk_size=None))]
fn first_kept_token(
    num_tokens: &Bound<'_, PyAny>,
    sliding_window: Option<&Bound<'_, PyAny>>,
    attention_chunk_size: Option<&Bound<'_, PyAny>>,
) -> PyResult<u64> {
    let convert = || -> Converted<_> {
        let optional = |v: Option<&Bound<'_, PyAny>>, name| v.map(|v| to_u64(v, name)).transpose();
        Ok(crate::layout::first_kept_token(
            to_u64(num_tokens, "num_tokens")?,
            optional(sliding_window, "sliding_window")?,
            optional(attention_chunk_size, "attention_chunk_size")?,
        ))
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
    m.add_function(wrap_pyfunction!(model_shape_parts, m)?)?;
    m.add_function(wrap_pyfunction!(model_families, m)?)?;
    m.add("CACHE_KEYS", model::CACHE_KEYS.to_vec())?;
    m.add_function(wrap_pyfunction!(model_layers, m)?)?;
    m.add_function(wrap_pyfunction!(model_summary, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(first_kept_token, m)?)?;
    m.add_function(wrap_pyfunction!(vllm_layer_partition, m)?)?;
    m.add_function(wrap_pyfunction!(even_layer_partition, m)?)?;
    m.add("MODEL_PRESETS", model::PRESET_NAMES.to_vec())?;
    m.add("LAYER_KINDS", layer_kinds(m.py())?)?;
    Ok(())
}
