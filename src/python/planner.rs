//! `pdplan._core.Planner`, behind `pdplan.PDTransferPlanner`: converts its arguments, plans
//! without the GIL, and hands plans back as the reference's objects.

use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::convert::{
    buffer_layout, each, int_arg, parallel_layout, string_arg, type_name, Converted,
};
use super::objects::{rank_plan_object, FragmentFactory};
use super::to_py_err;
use crate::error::{bail, PlanError};
use crate::fragment::Fragment;
use crate::layout::{BufferLayout, ParallelLayout, Role};
use crate::layout_frame;
use crate::planner::{PlanOptions, Planner};
use crate::prepared::BufferFacts;
use crate::routing::DecodeReplicas;
use crate::verify;

/// One lost range as Python sees it (`pdplan.LostRange`'s fields).
type LostTuple = (u64, Option<u64>, u64, u64, Option<u64>, &'static str);

/// The ranks a caller named as gone: ints, read one by one and no more of them than the
/// prefill world has ranks (the core checks each), so an endless iterable ends in an error.
fn gone_ranks(ranks: &Bound<'_, PyAny>, world: u64) -> Converted<Vec<i128>> {
    if ranks.is_instance_of::<pyo3::types::PyString>()
        || ranks.is_instance_of::<pyo3::types::PyBytes>()
    {
        bail!(
            "ranks must be an iterable of ints, got {}",
            type_name(ranks)
        );
    }
    let iter = ranks.try_iter().map_err(|_| {
        PlanError::new(format!(
            "ranks must be an iterable of ints, got {}",
            type_name(ranks)
        ))
    })?;
    let mut out = Vec::new();
    for item in iter {
        let item = item.map_err(|e| PlanError::new(format!("ranks: {e}")))?;
        if out.len() as u64 >= world {
            bail!(
                "ranks names more than the {world} prefill ranks there are; name each \
                 unavailable rank once"
            );
        }
        out.push(int_arg(&item, "an unavailable prefill rank")?);
    }
    Ok(out)
}

/// The compiled planner behind `pdplan.PDTransferPlanner`.
#[pyclass(frozen, module = "pdplan._core", name = "Planner")]
pub struct PyPlanner {
    pub(super) inner: Planner,
}

impl PyPlanner {
    /// A router's prefill DP group: `None` (the default mapping) or an int the core checks.
    fn prefill_group(&self, group: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
        let Some(group) = group.filter(|g| !g.is_none()) else {
            return Ok(None);
        };
        int_arg(group, "prefill_dp_group")
            .and_then(|value| self.inner.prefill_group(value))
            .map(Some)
            .map_err(to_py_err)
    }

    /// A request's token count: `None` (any request) or an int the core checks.
    fn num_tokens(num_tokens: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
        let Some(count) = num_tokens.filter(|n| !n.is_none()) else {
            return Ok(None);
        };
        int_arg(count, "num_tokens")
            .and_then(Planner::num_tokens)
            .map(Some)
            .map_err(to_py_err)
    }

    /// The fragments `prefill_rank` sends `decode_rank`, planned here without the GIL: what a
    /// prepared transfer is built from when both sides hold the layouts.
    pub(super) fn fragments_between(
        &self,
        py: Python<'_>,
        (decode_rank, prefill_rank): (&Bound<'_, PyAny>, &Bound<'_, PyAny>),
        prefill_dp_group: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Fragment>> {
        let (rank, group, tokens) = self.request(decode_rank, prefill_dp_group, num_tokens)?;
        let source = int_arg(prefill_rank, "prefill_rank")
            .and_then(|value| self.inner.prefill().rank_coord(value))
            .map_err(to_py_err)?;
        let source = self.inner.prefill_ranks().rank(source);
        let sources = py
            .detach(|| self.inner.transfer_fragments(rank, group, tokens))
            .map_err(to_py_err)?;
        let names: Vec<u64> = sources.iter().map(|s| s.prefill_rank).collect();
        sources
            .into_iter()
            .find(|s| s.prefill_rank == source)
            .map(|s| s.fragments)
            .ok_or_else(|| {
                to_py_err(PlanError::new(format!(
                    "prefill rank {source} sends nothing to decode rank {rank}: its sources are \
                     {names:?}; prepare transfers for those (plan_for_decode_rank(...).\
                     source_ranks)"
                )))
            })
    }

    /// Each prefill buffer's index, layer and page size: what a prepared transfer selects a
    /// layer group and slices pages by.
    pub(super) fn buffer_facts(&self) -> Vec<BufferFacts> {
        self.inner
            .buffer_pairs()
            .map(|(prefill, _)| BufferFacts {
                buffer_index: prefill.buffer_index,
                layer: prefill.layer,
                page_size: prefill.page_size,
            })
            .collect()
    }

    /// What a request names, as every per-rank method takes it: the decode rank, a router's
    /// prefill DP group and the request's length, each checked by the core.
    fn request(
        &self,
        decode_rank: &Bound<'_, PyAny>,
        prefill_dp_group: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(u64, Option<u64>, Option<u64>)> {
        Ok((
            self.decode_rank(decode_rank)?,
            self.prefill_group(prefill_dp_group)?,
            Self::num_tokens(num_tokens)?,
        ))
    }

    fn decode_rank(&self, decode_rank: &Bound<'_, PyAny>) -> PyResult<u64> {
        int_arg(decode_rank, "decode_rank")
            .and_then(|value| self.inner.decode_rank(value))
            .map_err(to_py_err)
    }
}

#[pymethods]
impl PyPlanner {
    #[new]
    #[pyo3(signature = (prefill_layout, decode_layout, prefill_buffers, decode_buffers, decode_replicas=None, token_maps=false))]
    fn new(
        py: Python<'_>,
        prefill_layout: &Bound<'_, PyAny>,
        decode_layout: &Bound<'_, PyAny>,
        prefill_buffers: &Bound<'_, PyAny>,
        decode_buffers: &Bound<'_, PyAny>,
        decode_replicas: Option<&Bound<'_, PyAny>>,
        token_maps: bool,
    ) -> PyResult<Self> {
        let convert = || -> Converted<_> {
            let replicas = match decode_replicas {
                None => DecodeReplicas::First.as_str().to_owned(),
                Some(value) => string_arg(value, "decode_replicas")?,
            };
            Ok((
                parallel_layout(prefill_layout)?,
                parallel_layout(decode_layout)?,
                each(
                    prefill_buffers,
                    "prefill_buffers",
                    &crate::limits::LAYOUT_BUFFERS,
                    buffer_layout,
                )?,
                each(
                    decode_buffers,
                    "decode_buffers",
                    &crate::limits::LAYOUT_BUFFERS,
                    buffer_layout,
                )?,
                DecodeReplicas::parse(&replicas)?,
            ))
        };
        let (prefill, decode, prefill_buffers, decode_buffers, replicas) =
            convert().map_err(to_py_err)?;
        let options = PlanOptions {
            replicas,
            token_maps,
        };
        let inner = py
            .detach(|| {
                Planner::with_options(prefill, decode, &prefill_buffers, &decode_buffers, options)
            })
            .map_err(to_py_err)?;
        Ok(Self { inner })
    }

    #[pyo3(signature = (decode_rank, prefill_dp_group=None, num_tokens=None))]
    fn plan_for_decode_rank<'py>(
        &self,
        py: Python<'py>,
        decode_rank: &Bound<'py, PyAny>,
        prefill_dp_group: Option<&Bound<'py, PyAny>>,
        num_tokens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (rank, group, tokens) = self.request(decode_rank, prefill_dp_group, num_tokens)?;
        let plan = py
            .detach(|| self.inner.plan_for_decode_rank(rank, group, tokens))
            .map_err(to_py_err)?;
        rank_plan_object(py, &plan)
    }

    /// Fragments by prefill rank for both plan kinds (identity plans: whole items).
    #[pyo3(signature = (decode_rank, prefill_dp_group=None, num_tokens=None))]
    fn transfer_fragments<'py>(
        &self,
        py: Python<'py>,
        decode_rank: &Bound<'py, PyAny>,
        prefill_dp_group: Option<&Bound<'py, PyAny>>,
        num_tokens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (rank, group, tokens) = self.request(decode_rank, prefill_dp_group, num_tokens)?;
        let sources = py
            .detach(|| self.inner.transfer_fragments(rank, group, tokens))
            .map_err(to_py_err)?;
        let mut factory = FragmentFactory::new(py)?;
        let out = PyDict::new(py);
        for source in &sources {
            out.set_item(source.prefill_rank, factory.tuple(&source.fragments)?)?;
        }
        Ok(out)
    }

    /// Whether fragments of token-indexed buffers carry token geometry (asked for, or because
    /// their page sizes differ).
    #[getter]
    fn token_maps(&self) -> bool {
        self.inner.token_maps()
    }

    /// Checks every plan byte by byte against the layouts (for a request of `num_tokens`
    /// tokens, or any); raises naming the first problem.
    #[pyo3(signature = (num_tokens=None))]
    fn verify(&self, py: Python<'_>, num_tokens: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let tokens = Self::num_tokens(num_tokens)?;
        py.detach(|| verify::verify_at(&self.inner, tokens))
            .map_err(to_py_err)
    }

    /// Fanout of every prefill rank, in rank order.
    fn source_fanout<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (rank, fanout) in self.inner.source_fanout() {
            dict.set_item(rank, fanout)?;
        }
        Ok(dict)
    }

    /// Every (decode rank, prefill rank) pair that moves data, as four int64 arrays: decode
    /// rank, prefill rank, fragment count, bytes per page. Computed with the GIL released.
    #[allow(clippy::type_complexity)]
    fn routing_table<'py>(
        &self,
        py: Python<'py>,
    ) -> (
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<i64>>,
    ) {
        // Every value is below 2^63 (validated sizes, bounded world), so the casts are exact.
        let signed = |column: Vec<u64>| -> Vec<i64> {
            column
                .into_iter()
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
                .collect()
        };
        let table = py.detach(|| {
            let table = self.inner.routing_table();
            (
                signed(table.decode_rank),
                signed(table.prefill_rank),
                signed(table.fragment_count),
                signed(table.bytes_per_page),
            )
        });
        (
            table.0.into_pyarray(py),
            table.1.into_pyarray(py),
            table.2.into_pyarray(py),
            table.3.into_pyarray(py),
        )
    }

    /// A short stable hash of both layouts, the options, the wire versions and the planning
    /// rules: equal on both sides exactly when they plan alike.
    #[getter]
    fn fingerprint(&self) -> String {
        layout_frame::fingerprint(&self.inner)
    }

    /// Refuses a side's layout and buffers that differ from the planner's own view of that
    /// side, naming the first field that differs.
    fn check_layout(&self, layout: &Bound<'_, PyAny>, buffers: &Bound<'_, PyAny>) -> PyResult<()> {
        let convert = || -> Converted<_> {
            let layout = parallel_layout(layout)?;
            let buffers = each(
                buffers,
                "buffers",
                &crate::limits::LAYOUT_BUFFERS,
                buffer_layout,
            )?;
            let pairs = self.inner.buffer_pairs();
            let (expected, own): (&ParallelLayout, Vec<BufferLayout>) = match layout.role() {
                Role::Prefill => (self.inner.prefill(), pairs.map(|(p, _)| *p).collect()),
                Role::Decode => (self.inner.decode(), pairs.map(|(_, d)| *d).collect()),
            };
            if let Some(difference) =
                layout_frame::first_difference((expected, &own), (&layout, &buffers))
            {
                bail!(
                    "the peer's layout does not match this planner's: {difference} (expected \
                     first); both sides must describe the same layouts"
                );
            }
            Ok(())
        };
        convert().map_err(to_py_err)
    }

    /// This planner with the prefill ranks `ranks` unavailable (and any this one already
    /// lacks): reads from the ranks holding the same bytes, planned without the GIL.
    fn without_prefill_ranks(&self, py: Python<'_>, ranks: &Bound<'_, PyAny>) -> PyResult<Self> {
        let given = gone_ranks(ranks, self.inner.prefill().world_size()).map_err(to_py_err)?;
        let inner = py
            .detach(|| self.inner.without_prefill_ranks(&given))
            .map_err(to_py_err)?;
        Ok(Self { inner })
    }

    /// The prefill ranks that are unavailable, ascending.
    #[getter]
    fn unavailable_prefill_ranks(&self) -> Vec<u64> {
        self.inner.unavailable_prefill_ranks().to_vec()
    }

    /// What `decode_rank` cannot receive: `(buffer_index, layer, unit_start, unit_end,
    /// cp_share, buffer_kind)` tuples, buffer order.
    #[pyo3(signature = (decode_rank, prefill_dp_group=None, num_tokens=None))]
    fn lost(
        &self,
        py: Python<'_>,
        decode_rank: &Bound<'_, PyAny>,
        prefill_dp_group: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<LostTuple>> {
        let (rank, group, tokens) = self.request(decode_rank, prefill_dp_group, num_tokens)?;
        let lost = py
            .detach(|| self.inner.lost(rank, group, tokens))
            .map_err(to_py_err)?;
        Ok(lost
            .into_iter()
            .map(|r| {
                let kind = r.buffer_kind.as_str();
                (
                    r.buffer_index,
                    r.layer,
                    r.unit_start,
                    r.unit_end,
                    r.share,
                    kind,
                )
            })
            .collect())
    }

    #[getter]
    fn is_identity(&self) -> bool {
        self.inner.is_identity()
    }

    /// Whether either side runs pipeline stages.
    #[getter]
    fn is_staged(&self) -> bool {
        self.inner.is_staged()
    }

    /// Decode ranks that receive nothing (the runtime must copy inside their replica group).
    #[getter]
    fn idle_decode_ranks(&self) -> u64 {
        self.inner.idle_decode_ranks()
    }
}
