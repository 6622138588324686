//! `pdplan.PreparedRequest`: one request's page tables read once, with their page runs, for
//! each slice a runtime asks of it as its layers and tokens become final.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::slice_args::{flat_of, strided_of, SliceArgs};
use crate::descriptors::RequestPages;
use crate::prepared::Prepared;

/// One request's pages on a ``PreparedTransfer`` (``.request``): each slice's descriptors,
/// that transfer's for these pages, as layers and tokens become final.
#[pyclass(frozen, module = "pdplan._core", name = "PreparedRequest")]
pub struct PyPreparedRequest {
    prepared: Arc<Prepared>,
    pages: RequestPages<'static>,
}

impl PyPreparedRequest {
    pub fn new(prepared: Arc<Prepared>, src: Vec<u64>, dst: Vec<u64>) -> Self {
        let pages = RequestPages::new(src.into(), dst.into());
        Self { prepared, pages }
    }
}

#[pymethods]
impl PyPreparedRequest {
    /// ``PreparedTransfer.strided_descriptors`` of these pages.
    ///
    /// :param buffers: As there.
    /// :param layers: As there.
    /// :param tokens: As there.
    /// :param final_length: As there.
    /// :param decode_prefix: As there.
    #[pyo3(signature = (**slice))]
    fn strided_descriptors<'py>(
        &self,
        py: Python<'py>,
        slice: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let chosen = SliceArgs::parse(slice)?.of(&self.prepared)?;
        strided_of(py, &self.prepared, &self.pages, (&chosen.0, &chosen.1))
    }

    /// ``PreparedTransfer.descriptors`` of these pages.
    ///
    /// :param buffers: As there.
    /// :param coalesce: As there.
    /// :param layers: As there.
    /// :param tokens: As there.
    /// :param final_length: As there.
    /// :param decode_prefix: As there.
    #[pyo3(signature = (*, coalesce=true, **slice))]
    fn descriptors<'py>(
        &self,
        py: Python<'py>,
        coalesce: bool,
        slice: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let chosen = SliceArgs::parse(slice)?.of(&self.prepared)?;
        let pages = (self.pages.src(), self.pages.dst());
        flat_of(py, &self.prepared, pages, (&chosen.0, &chosen.1), coalesce)
    }

    /// The request's page pairs: as many as the shorter table's pages.
    fn __len__(&self) -> usize {
        self.pages.src().len().min(self.pages.dst().len())
    }
}
