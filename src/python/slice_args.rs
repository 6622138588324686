//! A request's slice as Python names it (`buffers`, `layers`, `tokens`, `final_length`,
//! `decode_prefix`), read once into the core's `Selection` and `TokenSlice` for every method
//! that takes one (`PreparedTransfer`'s and `PreparedRequest`'s), and the slice's flat or
//! strided lists made with the GIL released past a size.

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyRange, PyString};

use super::convert::{buffer_column, optional_u64, to_u64, u64_column, Converted};
use super::objects::{descriptors_object, strided_object};
use super::to_py_err;
use crate::descriptors::RequestPages;
use crate::error::PlanError;
use crate::limits;
use crate::prepared::{Prepared, Selection};
use crate::slices::TokenSlice;

/// Above this many descriptors a request is built with the GIL released.
const DETACH_FROM: u64 = 1 << 14;
/// Runs `work` without the GIL when it is larger than `from` (descriptors, bytes): releasing
/// and taking the GIL back costs more than a small request.
pub(super) fn detach_above_size<T, F>(py: Python<'_>, size: u64, from: u64, work: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if size > from {
        py.detach(work)
    } else {
        work()
    }
}

/// `detach_above_size` for a request of `descriptors` descriptors.
pub(super) fn detach_above<T, F>(py: Python<'_>, descriptors: u64, work: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    detach_above_size(py, descriptors, DETACH_FROM, work)
}

/// `None` (every buffer), a `range` of buffer indexes, or a sequence of them.
pub(super) fn selection(buffers: Option<&Bound<'_, PyAny>>) -> Converted<Selection> {
    let Some(buffers) = buffers.filter(|b| !b.is_none()) else {
        return Ok(Selection::All);
    };
    if let Ok(range) = buffers.cast::<PyRange>() {
        return range_of(range, "buffers");
    }
    buffer_column(buffers, "buffers").map(Selection::indices)
}

/// A `range` as a set, its start, stop and step each within 64 bits (`what` names it in an
/// error).
fn range_of(range: &Bound<'_, PyRange>, what: &str) -> Converted<Selection> {
    let py = range.py();
    let field = |name: &Bound<'_, PyString>| -> Converted<i64> {
        range
            .getattr(name)
            .and_then(|v| v.extract::<i64>())
            .map_err(|_| PlanError::new(format!("{what}: range {name} must fit 64 bits")))
    };
    Ok(Selection::Range {
        start: field(intern!(py, "start"))?,
        stop: field(intern!(py, "stop"))?,
        step: field(intern!(py, "step"))?,
    })
}

/// The layers a `range` names, as a set asked arithmetically (a layer group is most often
/// one): none of them negative.
fn layer_range(range: &Bound<'_, PyRange>) -> Converted<Selection> {
    let named = range_of(range, "layers")?;
    let Selection::Range { start, stop, step } = named else {
        return Ok(named);
    };
    let (first, end, stride) = (i128::from(start), i128::from(stop), i128::from(step));
    // The smallest layer named: the first going up, the last going down (none if empty).
    let smallest = if stride > 0 {
        (first < end).then_some(first)
    } else {
        (first > end).then(|| first + (first - end - 1) / -stride * stride)
    };
    if let Some(layer) = smallest.filter(|&l| l < 0) {
        return Err(PlanError::new(format!(
            "layers: {layer} is negative; a layer is a model layer index"
        )));
    }
    Ok(named)
}

/// A slice of a request: `tokens` (a `range` of step 1, or None), the final length and the
/// decode side's prefix (`slices` module).
pub(super) fn token_slice(
    tokens: Option<&Bound<'_, PyAny>>,
    final_length: Option<&Bound<'_, PyAny>>,
    decode_prefix: Option<&Bound<'_, PyAny>>,
) -> Converted<TokenSlice> {
    let tokens = match tokens.filter(|t| !t.is_none()) {
        None => None,
        Some(given) => {
            let Ok(range) = given.cast::<PyRange>() else {
                return Err(PlanError::new(
                    "tokens must be a range(start, stop) of the request's newly final tokens"
                        .to_owned(),
                ));
            };
            let field = |name: &str| -> Converted<u64> {
                let value = range.getattr(name).map_err(|_| {
                    PlanError::new(format!("tokens: the range's {name} is not readable"))
                })?;
                to_u64(&value, &format!("tokens' {name}"))
            };
            if field("step")? != 1 {
                return Err(PlanError::new(
                    "tokens must be a range of step 1: a slice is consecutive tokens".to_owned(),
                ));
            }
            Some((field("start")?, field("stop")?))
        }
    };
    let final_length = optional_u64(final_length, "final_length")?;
    let decode_prefix = optional_u64(decode_prefix, "decode_prefix")?.unwrap_or(0);
    for (name, value) in [
        ("final_length", final_length),
        ("decode_prefix", Some(decode_prefix)),
    ] {
        if let Some(value) = value {
            limits::TOKENS.check(name, value)?;
        }
    }
    Ok(TokenSlice {
        tokens,
        final_length,
        decode_prefix,
    })
}

/// A slice's flat descriptors of a request's pages, released from the GIL past
/// `DETACH_FROM` descriptors (`PreparedTransfer.descriptors`, `PreparedRequest.descriptors`).
pub(super) fn flat_of<'py>(
    py: Python<'py>,
    prepared: &Prepared,
    (src, dst): (&[u64], &[u64]),
    (chosen, slice): (&Selection, &TokenSlice),
    coalesce: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let request = || prepared.slice_descriptors(src, dst, chosen, coalesce, slice);
    let made = detach_above(py, prepared.descriptor_count(src.len(), chosen), request);
    descriptors_object(py, made.map_err(to_py_err)?)
}

/// A slice's strided lists of a request's pages (`PreparedTransfer.strided_descriptors`,
/// `PreparedRequest.strided_descriptors`). Rows are at most a run a fragment row (a slice of
/// tokens: a page a fragment row; every fragment counted, as asking each whether it is
/// selected costs a pass), and a row costs about four flat descriptors' writing where pages
/// scatter: released from the GIL past `DETACH_FROM` descriptors' worth.
pub(super) fn strided_of<'py>(
    py: Python<'py>,
    prepared: &Prepared,
    pages: &RequestPages<'_>,
    (chosen, slice): (&Selection, &TokenSlice),
) -> PyResult<Bound<'py, PyAny>> {
    let runs = if slice.is_whole() {
        pages.run_count()
    } else {
        pages.src().len()
    };
    let rows = prepared.descriptor_count(runs, &Selection::All);
    let request = || prepared.request_strided(pages, chosen, slice);
    let made = detach_above(py, rows.saturating_mul(4), request);
    strided_object(py, made.map_err(to_py_err)?)
}

/// The keyword arguments that name a slice: every method that takes a slice takes them as
/// `**slice` and reads them here, once.
const SLICE_KEYWORDS: [&str; 5] = [
    "buffers",
    "layers",
    "tokens",
    "final_length",
    "decode_prefix",
];

/// A slice as one call named it, read into the core's types: the buffers it selects, the model
/// layers it narrows them to, and its tokens (`TokenSlice`).
pub(super) struct SliceArgs {
    buffers: Selection,
    layers: Option<Selection>,
    tokens: TokenSlice,
}

impl SliceArgs {
    /// Reads a call's `**slice`; a keyword no slice takes is a `TypeError`, as Python's own.
    pub(super) fn parse(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut given: [Option<Bound<'_, PyAny>>; 5] = Default::default();
        for (key, value) in kwargs.into_iter().flat_map(PyDictMethods::iter) {
            let name = key.str()?.to_cow()?.into_owned();
            let Some(at) = SLICE_KEYWORDS.iter().position(|k| *k == name) else {
                let shown: String = name.chars().take(64).collect();
                return Err(PyTypeError::new_err(format!(
                    "unexpected keyword argument '{shown}'; a slice takes {}",
                    SLICE_KEYWORDS.join(", ")
                )));
            };
            given[at] = Some(value);
        }
        let [buffers, layers, tokens, final_length, decode_prefix] = given;
        let read = || -> Converted<Self> {
            Ok(Self {
                buffers: selection(buffers.as_ref())?,
                layers: layer_selection(layers.as_ref())?,
                tokens: token_slice(
                    tokens.as_ref(),
                    final_length.as_ref(),
                    decode_prefix.as_ref(),
                )?,
            })
        };
        read().map_err(to_py_err)
    }

    /// The buffers of `prepared` the slice selects (`buffers` narrowed to `layers`), and its
    /// tokens.
    pub(super) fn of(self, prepared: &Prepared) -> PyResult<(Selection, TokenSlice)> {
        let chosen = match self.layers {
            None => self.buffers,
            Some(layers) => prepared
                .select_layers(&layers, &self.buffers)
                .map_err(to_py_err)?,
        };
        Ok((chosen, self.tokens))
    }
}

/// The model layers a slice names: None (every layer), a `range`, or a sequence of them.
fn layer_selection(layers: Option<&Bound<'_, PyAny>>) -> Converted<Option<Selection>> {
    let Some(layers) = layers.filter(|l| !l.is_none()) else {
        return Ok(None);
    };
    Ok(Some(match layers.cast::<PyRange>() {
        Ok(range) => layer_range(range)?,
        Err(_) => Selection::indices(u64_column(layers, "layers")?),
    }))
}
