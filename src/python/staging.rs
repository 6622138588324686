//! `pdplan.StagingPlan`: one request's gather, transfer and scatter, held in Rust; host pack and
//! unpack into a caller's numpy staging array with the GIL released; the cost model's estimate.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::convert::{optional_u64, to_u64, Converted};
use super::objects::descriptors_object;
use super::package_types::package_type;
use super::to_py_err;
use crate::cost::CostModel;
use crate::error::PlanError;
use crate::host_copy;
use crate::layer_groups::{choose, LayerLoad};
use crate::staging::{StagingCounts, StagingPlan};

/// One request staged (``PreparedTransfer.staging_plan``): gather into a staging buffer
/// (the bytes in the direct descriptors' order, from offset 0, no gap), one transfer or chunks,
/// scatter: exactly the bytes the direct descriptors would write.
#[pyclass(frozen, module = "pdplan._core", name = "StagingPlan")]
pub struct PyStagingPlan {
    inner: StagingPlan,
}

impl From<StagingPlan> for PyStagingPlan {
    fn from(inner: StagingPlan) -> Self {
        Self { inner }
    }
}

const STAGING_ARRAY: &str =
    "staging must be a 1-D C-contiguous numpy uint8 array (for example np.empty(plan.staging_bytes, np.uint8))";

#[pymethods]
impl PyStagingPlan {
    /// Source cache addresses -> offsets in the source staging buffer (made on each call);
    /// runs that continue each other in the source cache merge.
    #[getter]
    fn gather<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        descriptors_object(py, self.inner.gather().clone())
    }

    /// Offsets in the destination staging buffer -> destination cache addresses, merged
    /// wherever the destination continues.
    #[getter]
    fn scatter<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        descriptors_object(py, self.inner.scatter().clone())
    }

    /// Bytes of the request: the least each side's staging buffer must hold.
    #[getter]
    fn staging_bytes(&self) -> u64 {
        self.inner.staging_bytes()
    }

    /// The wire hop's chunk size, as asked for; None: one transfer.
    #[getter]
    fn chunk_bytes(&self) -> Option<u64> {
        self.inner.chunk_bytes()
    }

    /// ``StagingCounts`` (direct, wire, gather, scatter descriptors, bytes): what a cost
    /// model weighs.
    #[getter]
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        counts_object(py, self.inner.counts())
    }

    /// Descriptors the request takes without staging (``counts.direct_descriptors``).
    #[getter]
    fn num_direct_descriptors(&self) -> u64 {
        self.inner.counts().direct
    }

    /// Descriptors of the wire hop: one, or one per chunk (``counts.wire_descriptors``).
    #[getter]
    fn num_wire_descriptors(&self) -> u64 {
        self.inner.counts().transfer
    }

    /// Descriptors of the gather (``counts.gather_descriptors``).
    #[getter]
    fn num_gather_descriptors(&self) -> u64 {
        self.inner.counts().gather
    }

    /// Descriptors of the scatter (``counts.scatter_descriptors``).
    #[getter]
    fn num_scatter_descriptors(&self) -> u64 {
        self.inner.counts().scatter
    }

    /// The engine's descriptors between the two staging buffers (the wire hop): one, or one
    /// per chunk. A staging buffer whose size is given and is too small is refused.
    ///
    /// :param src_staging_base: The source staging buffer's address.
    /// :param dst_staging_base: The destination staging buffer's address.
    /// :param src_staging_bytes: The source staging buffer's size; None: not checked.
    /// :param dst_staging_bytes: The destination staging buffer's size; None: not checked.
    #[pyo3(signature = (src_staging_base, dst_staging_base, *, src_staging_bytes=None, dst_staging_bytes=None))]
    fn wire_descriptors<'py>(
        &self,
        py: Python<'py>,
        src_staging_base: &Bound<'py, PyAny>,
        dst_staging_base: &Bound<'py, PyAny>,
        src_staging_bytes: Option<&Bound<'py, PyAny>>,
        dst_staging_bytes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let convert = || -> Converted<_> {
            let bases = (
                to_u64(src_staging_base, "src_staging_base")?,
                to_u64(dst_staging_base, "dst_staging_base")?,
            );
            let sizes = (
                optional_u64(src_staging_bytes, "src_staging_bytes")?,
                optional_u64(dst_staging_bytes, "dst_staging_bytes")?,
            );
            self.inner.transfer(bases, sizes)
        };
        descriptors_object(py, convert().map_err(to_py_err)?)
    }

    /// Copies the source caches into ``staging`` (host memory), the GIL released, where
    /// they live (read in this process, inside the plan's ``src_limits``).
    ///
    /// :param staging: A writable 1-D C-contiguous numpy ``uint8`` array of at least
    ///     ``staging_bytes``, overlapping no cache.
    fn pack(&self, py: Python<'_>, staging: &Bound<'_, PyAny>) -> PyResult<()> {
        let array = staging_array(staging)?;
        let mut writable = array.try_readwrite().map_err(|_| {
            to_py_err(PlanError::new(
                "staging is not writable (or is borrowed elsewhere); pass a writable array",
            ))
        })?;
        let slice = writable
            .as_slice_mut()
            .map_err(|_| to_py_err(PlanError::new(STAGING_ARRAY)))?;
        py.detach(|| host_copy::pack(&self.inner, slice))
            .map_err(to_py_err)
    }

    /// Copies ``staging`` (host memory) into the destination caches, the GIL released,
    /// where they live (the decode side's plan; inside its ``dst_limits``).
    ///
    /// :param staging: A 1-D C-contiguous numpy ``uint8`` array of at least
    ///     ``staging_bytes``, as ``pack`` filled it, overlapping no cache.
    fn unpack(&self, py: Python<'_>, staging: &Bound<'_, PyAny>) -> PyResult<()> {
        let array = staging_array(staging)?;
        let readable = array.try_readonly().map_err(|_| {
            to_py_err(PlanError::new(
                "staging is borrowed mutably elsewhere; pass an array no one is writing",
            ))
        })?;
        let slice = readable
            .as_slice()
            .map_err(|_| to_py_err(PlanError::new(STAGING_ARRAY)))?;
        py.detach(|| host_copy::unpack(&self.inner, slice))
            .map_err(to_py_err)
    }
}

fn staging_array<'a, 'py>(
    staging: &'a Bound<'py, PyAny>,
) -> PyResult<&'a Bound<'py, PyArray1<u8>>> {
    staging
        .cast::<PyArray1<u8>>()
        .map_err(|_| to_py_err(PlanError::new(STAGING_ARRAY)))
}

/// A request's staging counts as Python gets them: (direct, wire, gather, scatter,
/// bytes).
pub type CountsTuple = (u64, u64, u64, u64, u64);

/// A request's counts as `pdplan.StagingCounts`.
pub fn counts_object(py: Python<'_>, c: StagingCounts) -> PyResult<Bound<'_, PyAny>> {
    static COUNTS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let cls = COUNTS.get_or_try_init(py, || -> PyResult<_> {
        Ok(package_type(py, "StagingCounts")?.unbind())
    })?;
    cls.bind(py)
        .call1((c.direct, c.transfer, c.gather, c.scatter, c.bytes))
}

/// Staging counts from the five a `StagingCounts` tuple holds, in its order.
pub fn counts_of((direct, transfer, gather, scatter, bytes): CountsTuple) -> StagingCounts {
    StagingCounts {
        direct,
        transfer,
        gather,
        scatter,
        bytes,
    }
}

/// The cost model's five figures, as `CostModel._figures` gives them.
pub type Figures = (f64, f64, f64, f64, f64);

/// The core's cost model of the five figures, refused where they make no estimate.
pub fn model_of(figures: Figures) -> PyResult<CostModel> {
    let (per_descriptor_s, network_bytes_per_s, copy_bytes_per_s, per_copy_s, per_segment_s) =
        figures;
    CostModel::new(
        (per_descriptor_s, network_bytes_per_s),
        (copy_bytes_per_s, per_copy_s, per_segment_s),
    )
    .map_err(to_py_err)
}

/// The cost model's figures for a request's counts (`StagingPlan.counts`), in seconds: direct,
/// staging, gather, wire, scatter.
#[pyfunction]
pub fn estimate_staging(
    counts: CountsTuple,
    figures: Figures,
) -> PyResult<(f64, f64, f64, f64, f64)> {
    let model = model_of(figures)?;
    let e = model.estimate(&counts_of(counts));
    Ok((e.direct_s, e.staging_s, e.gather_s, e.wire_s, e.scatter_s))
}

/// Counts of a request over ``per`` scattered pages (``scattered_page_counts``), scaled to
/// ``pages`` pages in one transfer; refused where they do not scale evenly.
///
/// :param counts: The five staging counts over ``per`` pages.
/// :param per: The pages they were counted over.
/// :param pages: The pages to scale them to.
#[pyfunction]
pub fn scaled_counts(
    py: Python<'_>,
    counts: CountsTuple,
    per: u64,
    pages: u64,
) -> PyResult<Bound<'_, PyAny>> {
    let counts = counts_of(counts);
    counts_object(py, counts.scaled(per, pages).map_err(to_py_err)?)
}

/// Checks a cost model's figures (called from `CostModel.__post_init__`).
#[pyfunction]
pub fn check_cost_model(figures: Figures) -> PyResult<()> {
    model_of(figures).map(drop)
}

/// The groups chosen, and the seconds from prefill's end to the last byte, streamed and whole.
type Chosen = (Vec<(u64, u64)>, f64, f64);

/// Layer groups for streaming (`layer_groups::choose`): `loads` one `(descriptors, bytes)` a
/// layer; the cost model's five figures as `CostModel._figures` gives them. Returns the
/// `[start, stop)` groups and the seconds from prefill's end to the last byte, streamed and
/// whole.
#[pyfunction]
#[pyo3(signature = (loads, layer_seconds, per_transfer_s, figures))]
pub fn layer_groups(
    py: Python<'_>,
    loads: Vec<(u64, u64)>,
    layer_seconds: f64,
    per_transfer_s: f64,
    figures: Figures,
) -> PyResult<Chosen> {
    let model = model_of(figures)?;
    let loads: Vec<LayerLoad> = loads
        .into_iter()
        .map(|(descriptors, bytes)| LayerLoad { descriptors, bytes })
        .collect();
    let chosen = py
        .detach(|| choose(&loads, layer_seconds, per_transfer_s, &model))
        .map_err(to_py_err)?;
    Ok((chosen.groups, chosen.tail_s, chosen.whole_tail_s))
}
