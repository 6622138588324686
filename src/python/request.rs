//! `pdplan.PreparedRequest`: one request's page tables read once, with their page runs, for
//! each slice a runtime asks of it as its layers and tokens become final.

use std::sync::Arc;

use pyo3::prelude::*;

use super::objects::{descriptors_object, strided_object};
use super::prepared::{detach_above, slice_of};
use super::to_py_err;
use crate::descriptors::RequestPages;
use crate::prepared::{Prepared, Selection};

/// One request's pages on a prepared transfer (`PreparedTransfer.request`).
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
    /// `PreparedTransfer.strided_descriptors` of these pages.
    #[pyo3(signature = (*, buffers=None, layers=None, tokens=None, final_length=None, decode_prefix=None))]
    fn strided_descriptors<'py>(
        &self,
        py: Python<'py>,
        buffers: Option<&Bound<'py, PyAny>>,
        layers: Option<&Bound<'py, PyAny>>,
        tokens: Option<&Bound<'py, PyAny>>,
        final_length: Option<&Bound<'py, PyAny>>,
        decode_prefix: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (chosen, slice) = slice_of(
            &self.prepared,
            buffers,
            layers,
            [tokens, final_length, decode_prefix],
        )?;
        // Rows are at most a run a fragment row (a slice of tokens: a page a fragment row):
        // released where that many may be written (every fragment counted: asking each
        // whether it is selected costs a pass).
        let runs = if slice.is_whole() {
            self.pages.run_count()
        } else {
            self.pages.src().len()
        };
        let rows = self.prepared.descriptor_count(runs, &Selection::All);
        let request = || self.prepared.request_strided(&self.pages, &chosen, &slice);
        strided_object(py, detach_above(py, rows, request).map_err(to_py_err)?)
    }

    /// `PreparedTransfer.descriptors` of these pages.
    #[pyo3(signature = (*, buffers=None, coalesce=true, layers=None, tokens=None, final_length=None, decode_prefix=None))]
    #[allow(clippy::too_many_arguments)]
    fn descriptors<'py>(
        &self,
        py: Python<'py>,
        buffers: Option<&Bound<'py, PyAny>>,
        coalesce: bool,
        layers: Option<&Bound<'py, PyAny>>,
        tokens: Option<&Bound<'py, PyAny>>,
        final_length: Option<&Bound<'py, PyAny>>,
        decode_prefix: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (chosen, slice) = slice_of(
            &self.prepared,
            buffers,
            layers,
            [tokens, final_length, decode_prefix],
        )?;
        let (src, dst) = (self.pages.src(), self.pages.dst());
        let count = self.prepared.descriptor_count(src.len(), &chosen);
        let request = || {
            self.prepared
                .slice_descriptors(src, dst, &chosen, coalesce, &slice)
        };
        descriptors_object(py, detach_above(py, count, request).map_err(to_py_err)?)
    }

    /// The request's page pairs: as many as the shorter table's pages.
    fn __len__(&self) -> usize {
        self.pages.src().len().min(self.pages.dst().len())
    }
}
