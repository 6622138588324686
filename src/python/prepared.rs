//! `pdplan.PreparedTransfer`: the per-request path. Built once per (prefill rank, decode rank)
//! pair from fragments or straight from wire frames (no Python fragment objects), then each
//! request turns its pages into descriptors, or into indices of NIXL's prepped lists.

use std::sync::Arc;

use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods};
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::convert::{
    buffers, fragments_of, frame, i64_column, optional_u64, to_u64, u64_column, Converted,
};
use super::objects::{descriptors_object, model_types, strided_object, FragmentFactory};
use super::planner::PyPlanner;
use super::request::PyPreparedRequest;
use super::slice_args::{
    detach_above, detach_above_size, flat_of, selection, strided_of, SliceArgs,
};
use super::staging::{counts_object, PyStagingPlan};
use super::{frame_limits, to_py_err};
use crate::descriptors::{Descriptors, RequestPages};
use crate::error::PlanError;
use crate::frame_cache;
use crate::limits;
use crate::prepared::{BufferFacts, Prepared, Selection};
use crate::slices::TokenSlice;
use crate::staging::StagingCounts;
use crate::token_descriptors::PlannedTokens;

/// (local, remote) arrays.
type Pair<'py, T> = (Bound<'py, T>, Bound<'py, T>);

/// Slot maps up to this many tokens, int64 and contiguous, are read in place with the GIL
/// held (a scan of tens of microseconds, cheaper than copying them into fresh memory); longer
/// ones are copied and read without it.
const READ_IN_PLACE_UP_TO: usize = 1 << 20;
/// Above this many payload bytes frames are parsed with the GIL released.
const DETACH_PAYLOAD_FROM: u64 = 1 << 16;

/// One (prefill rank, decode rank) pair's fragments, checked once against both sides'
/// buffers (base addresses and limits, by ``buffer_index``), for many requests: each then names
/// only its pages or slot maps. ``from_frames`` prepares one from a peer's wire frames,
/// ``from_layouts`` from a planner. Thread-safe to share.
///
/// :param fragments: One rank pair's fragments.
/// :param src_base_ptrs: Each source buffer's base address, indexed by ``buffer_index``.
/// :param dst_base_ptrs: Each destination buffer's base address, indexed by
///     ``buffer_index``.
/// :param src_limits: How many bytes from each source base may be touched, indexed by
///     ``buffer_index``; None: no limit (only 64-bit overflow is refused).
/// :param dst_limits: The same for the destination buffers.
/// :param buffer_layouts: The prefill side's ``BufferLayout`` s (each buffer's layer and
///     page size, for slices); None: none known.
#[pyclass(frozen, module = "pdplan._core", name = "PreparedTransfer")]
pub struct PyPrepared {
    /// Shared with the frame cache's memo when prepared from frames seen before.
    inner: Arc<Prepared>,
}

/// `prepared` knowing its buffers' layers and page sizes where `buffer_layouts` gives them.
fn with_buffers(
    prepared: Prepared,
    buffer_layouts: Option<&Bound<'_, PyAny>>,
) -> Converted<Prepared> {
    Ok(match buffer_layouts.filter(|l| !l.is_none()) {
        Some(layouts) => prepared.with_buffers(buffer_facts(layouts)?),
        None => prepared,
    })
}

/// Each buffer's index, layer and page size, from a sequence of `BufferLayout`s.
fn buffer_facts(layouts: &Bound<'_, PyAny>) -> Converted<Vec<BufferFacts>> {
    let bad = || PlanError::new("buffer_layouts must be a sequence of BufferLayouts".to_owned());
    let mut out = Vec::new();
    for item in layouts.try_iter().map_err(|_| bad())? {
        let item = item.map_err(|_| bad())?;
        limits::LAYOUT_BUFFERS.check("buffer_layouts", out.len() as u64 + 1)?;
        let field = |name: &str| item.getattr(name).map_err(|_| bad());
        out.push(BufferFacts {
            buffer_index: to_u64(&field("buffer_index")?, "buffer_layouts[i].buffer_index")?,
            layer: optional_u64(Some(&field("layer")?), "buffer_layouts[i].layer")?,
            page_size: to_u64(&field("page_size")?, "buffer_layouts[i].page_size")?,
        });
    }
    Ok(out)
}

fn strided(py: Python<'_>, rows: Vec<[u64; 5]>) -> PyResult<Bound<'_, PyArray2<u64>>> {
    let n = rows.len();
    rows.into_iter()
        .flatten()
        .collect::<Vec<u64>>()
        .into_pyarray(py)
        .reshape([n, 5])
}

#[pymethods]
impl PyPrepared {
    #[new]
    #[pyo3(signature = (fragments, src_base_ptrs, dst_base_ptrs, *, src_limits=None, dst_limits=None, buffer_layouts=None))]
    fn new(
        py: Python<'_>,
        fragments: &Bound<'_, PyAny>,
        src_base_ptrs: &Bound<'_, PyAny>,
        dst_base_ptrs: &Bound<'_, PyAny>,
        src_limits: Option<&Bound<'_, PyAny>>,
        dst_limits: Option<&Bound<'_, PyAny>>,
        buffer_layouts: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let types = model_types(py)?;
        let convert = || -> Converted<_> {
            let fragments = fragments_of(fragments, "fragments", types)?;
            let src = buffers(src_base_ptrs, src_limits, "src")?;
            let dst = buffers(dst_base_ptrs, dst_limits, "dst")?;
            let prepared = Prepared::new(fragments.into(), &src, &dst)?;
            with_buffers(prepared, buffer_layouts).map(Arc::new)
        };
        convert().map(|inner| Self { inner }).map_err(to_py_err)
    }

    /// Prepared from a peer's wire frames, read as strictly as ``decode_transfer_fragments``
    /// does, making no fragment objects; frames seen before reuse their parse (a bounded cache).
    ///
    /// :param version_frame: The version frame.
    /// :param payload_frame: The payload frame.
    /// :param src_base_ptrs: Each source buffer's base address, indexed by ``buffer_index``.
    /// :param dst_base_ptrs: The same for the destination buffers.
    /// :param src_limits: Bytes from each source base that may be touched, by
    ///     ``buffer_index``; None: no limit (only 64-bit overflow is refused).
    /// :param dst_limits: The same for the destination buffers.
    /// :param max_payload_bytes: The longest payload accepted, as in
    ///     ``decode_transfer_fragments``.
    /// :param max_fragments: The most fragments accepted, as in ``decode_transfer_fragments``.
    /// :param buffer_layouts: The prefill side's ``BufferLayout`` s (each buffer's layer and
    ///     page size, for slices); None: none known.
    #[staticmethod]
    #[pyo3(signature = (version_frame, payload_frame, src_base_ptrs, dst_base_ptrs, *, src_limits=None, dst_limits=None, max_payload_bytes=None, max_fragments=None, buffer_layouts=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_frames(
        py: Python<'_>,
        version_frame: &Bound<'_, PyAny>,
        payload_frame: &Bound<'_, PyAny>,
        src_base_ptrs: &Bound<'_, PyAny>,
        dst_base_ptrs: &Bound<'_, PyAny>,
        src_limits: Option<&Bound<'_, PyAny>>,
        dst_limits: Option<&Bound<'_, PyAny>>,
        max_payload_bytes: Option<&Bound<'_, PyAny>>,
        max_fragments: Option<&Bound<'_, PyAny>>,
        buffer_layouts: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let facts = buffer_layouts
            .filter(|l| !l.is_none())
            .map(buffer_facts)
            .transpose()
            .map_err(to_py_err)?;
        let convert = || -> Converted<_> {
            let limits = frame_limits(max_payload_bytes, max_fragments)?;
            let version = frame(version_frame, "version_frame")?;
            let payload = frame(payload_frame, "payload_frame")?;
            let src = buffers(src_base_ptrs, src_limits, "src")?;
            let dst = buffers(dst_base_ptrs, dst_limits, "dst")?;
            let prepare = || frame_cache::prepare_cached(version, payload, limits, (&src, &dst));
            // Bytes are immutable and the caller holds them: large new frames parse without
            // the GIL; a small or known frame costs less than releasing it.
            let payload_len = payload.map_or(0, <[u8]>::len) as u64;
            let prepared = detach_above_size(py, payload_len, DETACH_PAYLOAD_FROM, prepare)?;
            // A cached transfer is shared: one knowing its buffers is a copy of its own.
            Ok(match facts {
                Some(facts) => Arc::new(Prepared::clone(&prepared).with_buffers(facts)),
                None => prepared,
            })
        };
        convert().map(|inner| Self { inner }).map_err(to_py_err)
    }

    /// Prepared straight from a planner both sides built from exchanged layouts: the
    /// fragments ``prefill_rank`` sends ``decode_rank``, planned here, never made into objects
    /// nor framed. It knows the planner's buffers (``buffer_layouts``), for slices.
    ///
    /// :param planner: The ``PDTransferPlanner``.
    /// :param decode_rank: The decode rank that receives.
    /// :param prefill_rank: The prefill rank that sends.
    /// :param src_base_ptrs: Each source buffer's base address, indexed by ``buffer_index``.
    /// :param dst_base_ptrs: The same for the destination buffers.
    /// :param src_limits: Bytes from each source base that may be touched, by
    ///     ``buffer_index``; None: no limit (only 64-bit overflow is refused).
    /// :param dst_limits: The same for the destination buffers.
    /// :param prefill_dp_group: The prefill DP group read from, as in
    ///     ``PDTransferPlanner.plan_for_decode_rank``.
    /// :param num_tokens: The request's length, as in
    ///     ``PDTransferPlanner.plan_for_decode_rank``.
    #[staticmethod]
    #[pyo3(signature = (planner, decode_rank, prefill_rank, src_base_ptrs, dst_base_ptrs, *, src_limits=None, dst_limits=None, prefill_dp_group=None, num_tokens=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_layouts(
        py: Python<'_>,
        planner: &Bound<'_, PyAny>,
        decode_rank: &Bound<'_, PyAny>,
        prefill_rank: &Bound<'_, PyAny>,
        src_base_ptrs: &Bound<'_, PyAny>,
        dst_base_ptrs: &Bound<'_, PyAny>,
        src_limits: Option<&Bound<'_, PyAny>>,
        dst_limits: Option<&Bound<'_, PyAny>>,
        prefill_dp_group: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // A `PDTransferPlanner` holds its compiled planner as `_core`.
        let core = match planner.cast::<PyPlanner>() {
            Ok(core) => core.clone(),
            Err(_) => planner
                .getattr("_core")
                .ok()
                .and_then(|c| c.cast_into::<PyPlanner>().ok())
                .ok_or_else(|| {
                    to_py_err(PlanError::new(
                        "planner must be a PDTransferPlanner".to_owned(),
                    ))
                })?,
        };
        let fragments = core.get().fragments_between(
            py,
            (decode_rank, prefill_rank),
            prefill_dp_group,
            num_tokens,
        )?;
        let facts = core.get().buffer_facts();
        let convert = || -> Converted<_> {
            let src = buffers(src_base_ptrs, src_limits, "src")?;
            let dst = buffers(dst_base_ptrs, dst_limits, "dst")?;
            // The planner's fragments are valid by construction; it knows the buffers.
            Prepared::from_valid(fragments.into(), &src, &dst)
                .map(|p| Arc::new(p.with_buffers(facts)))
        };
        convert().map(|inner| Self { inner }).map_err(to_py_err)
    }

    /// One request's descriptors: ``transfer_descriptors`` over the fragments of
    /// ``buffers``, in fragment order, bounds-checked per request. A slice (the streaming
    /// guide) moves a page where its last token becomes final (a partial last page once
    /// ``final_length`` is reached), never pages below the prefix or a window's kept tokens,
    /// and state in the slice ending at ``final_length``.
    ///
    /// :param src_pages: The request's source pages, one per page pair: a 1-D integer
    ///     array (any integer dtype) or an int sequence.
    /// :param dst_pages: The destination pages they pair with, as many.
    /// :param buffers: The buffers whose fragments count (a ``range`` or a sequence of
    ///     ``buffer_index`` values); None: all.
    /// :param coalesce: Merge neighbours that continue each other on both sides, as
    ///     ``transfer_descriptors`` does.
    /// :param layers: A slice's layer group: only buffers of these model layers (within
    ///     ``buffers``); needs ``buffer_layouts``.
    /// :param tokens: A slice's tokens, ``range(start, stop)``: those newly final. None: all.
    /// :param final_length: The request's length once known: windows and chunks keep their
    ///     tokens of it, and state moves in the slice ending at it. None: not known yet.
    /// :param decode_prefix: Tokens the decode side holds already: they never move.
    #[pyo3(signature = (src_pages, dst_pages, *, coalesce=true, **slice))]
    fn descriptors<'py>(
        &self,
        py: Python<'py>,
        src_pages: &Bound<'py, PyAny>,
        dst_pages: &Bound<'py, PyAny>,
        coalesce: bool,
        slice: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (src, dst) = (
            u64_column(src_pages, "src_pages").map_err(to_py_err)?,
            u64_column(dst_pages, "dst_pages").map_err(to_py_err)?,
        );
        let (chosen, slice) = SliceArgs::parse(slice)?.of(&self.inner)?;
        flat_of(py, &self.inner, (&src, &dst), (&chosen, &slice), coalesce)
    }

    /// One request's descriptors from its slot maps: a token moves where both hold it
    /// (fragments need token geometry: ``PDTransferPlanner(..., token_maps=True)``). A slice
    /// moves tokens ``[max(start, decode_prefix, kept), stop)``, ``kept`` the first token a
    /// window or chunk keeps of ``final_length`` (of ``stop`` while unknown).
    ///
    /// :param src_slots: The source rank's slot map: entry ``t`` is token ``t``'s slot on
    ///     that rank (``page * page_size + position``), or -1 (``token_slots`` makes one).
    /// :param dst_slots: The destination rank's slot map; a token moves where both are set.
    /// :param buffers: The buffers whose fragments count (a ``range`` or a sequence of
    ///     ``buffer_index`` values); None: all.
    /// :param coalesce: Merge neighbours that continue each other on both sides.
    /// :param layers: A slice's layer group: only buffers of these model layers (within
    ///     ``buffers``); needs ``buffer_layouts``.
    /// :param tokens: A slice's tokens, ``range(start, stop)``: those newly final. None: all.
    /// :param final_length: The request's length once known: windows and chunks keep their
    ///     tokens of it, and state moves in the slice ending at it. None: not known yet.
    /// :param decode_prefix: Tokens the decode side holds already: they never move.
    #[pyo3(signature = (src_slots, dst_slots, *, coalesce=true, **slice))]
    fn token_descriptors<'py>(
        &self,
        py: Python<'py>,
        src_slots: &Bound<'py, PyAny>,
        dst_slots: &Bound<'py, PyAny>,
        coalesce: bool,
        slice: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (chosen, slice) = SliceArgs::parse(slice)?.of(&self.inner)?;
        let made = self.direct_from_slots(py, (src_slots, dst_slots), &chosen, coalesce, &slice)?;
        descriptors_object(py, made)
    }

    /// ``descriptors(...)`` as NIXL 1.5's strided lists: page runs a row a fragment row.
    ///
    /// :param src_pages: As in ``descriptors``.
    /// :param dst_pages: As in ``descriptors``.
    /// :param buffers: As in ``descriptors``.
    /// :param layers: As in ``descriptors``.
    /// :param tokens: As in ``descriptors``.
    /// :param final_length: As in ``descriptors``.
    /// :param decode_prefix: As in ``descriptors``.
    #[pyo3(signature = (src_pages, dst_pages, **slice))]
    fn strided_descriptors<'py>(
        &self,
        py: Python<'py>,
        src_pages: &Bound<'py, PyAny>,
        dst_pages: &Bound<'py, PyAny>,
        slice: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (src, dst) = (
            u64_column(src_pages, "src_pages").map_err(to_py_err)?,
            u64_column(dst_pages, "dst_pages").map_err(to_py_err)?,
        );
        let (chosen, slice) = SliceArgs::parse(slice)?.of(&self.inner)?;
        let pages = RequestPages::new((&src[..]).into(), (&dst[..]).into());
        strided_of(py, &self.inner, &pages, (&chosen, &slice))
    }

    /// One request's page tables read once, with their page runs: its slices
    /// (``PreparedRequest``) then skip reading them, the per-call cost streaming pays.
    ///
    /// :param src_pages: As in ``descriptors``.
    /// :param dst_pages: As in ``descriptors``.
    fn request(
        &self,
        src_pages: &Bound<'_, PyAny>,
        dst_pages: &Bound<'_, PyAny>,
    ) -> PyResult<PyPreparedRequest> {
        let (src, dst) = (
            u64_column(src_pages, "src_pages").map_err(to_py_err)?,
            u64_column(dst_pages, "dst_pages").map_err(to_py_err)?,
        );
        Ok(PyPreparedRequest::new(Arc::clone(&self.inner), src, dst))
    }

    /// ``token_descriptors(...)`` as NIXL 1.5's strided lists.
    ///
    /// :param src_slots: As in ``token_descriptors``.
    /// :param dst_slots: As in ``token_descriptors``.
    /// :param buffers: As in ``token_descriptors``.
    /// :param layers: As in ``token_descriptors``.
    /// :param tokens: As in ``token_descriptors``.
    /// :param final_length: As in ``token_descriptors``.
    /// :param decode_prefix: As in ``token_descriptors``.
    #[pyo3(signature = (src_slots, dst_slots, **slice))]
    fn token_strided_descriptors<'py>(
        &self,
        py: Python<'py>,
        src_slots: &Bound<'py, PyAny>,
        dst_slots: &Bound<'py, PyAny>,
        slice: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (chosen, slice) = SliceArgs::parse(slice)?.of(&self.inner)?;
        let slots = (src_slots, dst_slots);
        let write = |planned: PlannedTokens<'_>| planned.write_strided();
        let made = self.build_from_slots(py, slots, &chosen, true, &slice, write)?;
        strided_object(py, made)
    }

    /// One request's staging plan from its pages: ``descriptors(src_pages, dst_pages,
    /// buffers=buffers)`` regrouped into gather, transfer and scatter.
    ///
    /// :param src_pages: As in ``descriptors``.
    /// :param dst_pages: The destination pages they pair with, as many.
    /// :param buffers: As in ``descriptors``.
    /// :param chunk_bytes: The wire hop in chunks of at most this many bytes (one descriptor
    ///     each); None: one transfer.
    #[pyo3(signature = (src_pages, dst_pages, *, buffers=None, chunk_bytes=None))]
    fn staging_plan(
        &self,
        py: Python<'_>,
        src_pages: &Bound<'_, PyAny>,
        dst_pages: &Bound<'_, PyAny>,
        buffers: Option<&Bound<'_, PyAny>>,
        chunk_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStagingPlan> {
        let convert = || -> Converted<_> {
            Ok((
                u64_column(src_pages, "src_pages")?,
                u64_column(dst_pages, "dst_pages")?,
                selection(buffers)?,
                optional_u64(chunk_bytes, "chunk_bytes")?,
            ))
        };
        let (src, dst, chosen, chunk) = convert().map_err(to_py_err)?;
        let request = || self.inner.staging_plan((&src, &dst), &chosen, chunk);
        let made = detach_above(py, self.inner.descriptor_count(src.len(), &chosen), request);
        made.map(PyStagingPlan::from).map_err(to_py_err)
    }

    /// One request's staging plan from its slot maps: ``token_descriptors(src_slots,
    /// dst_slots, buffers=buffers)`` regrouped into gather, transfer and scatter.
    ///
    /// :param src_slots: As in ``token_descriptors``.
    /// :param dst_slots: As in ``token_descriptors``.
    /// :param buffers: As in ``descriptors``.
    /// :param chunk_bytes: The wire hop in chunks of at most this many bytes (one descriptor
    ///     each); None: one transfer.
    #[pyo3(signature = (src_slots, dst_slots, *, buffers=None, chunk_bytes=None))]
    fn token_staging_plan(
        &self,
        py: Python<'_>,
        src_slots: &Bound<'_, PyAny>,
        dst_slots: &Bound<'_, PyAny>,
        buffers: Option<&Bound<'_, PyAny>>,
        chunk_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStagingPlan> {
        let chunk = optional_u64(chunk_bytes, "chunk_bytes").map_err(to_py_err)?;
        let chosen = selection(buffers).map_err(to_py_err)?;
        let whole = TokenSlice::default();
        let direct = self.direct_from_slots(py, (src_slots, dst_slots), &chosen, true, &whole)?;
        let stage = || self.inner.stage(&direct, chunk);
        let made = detach_above(py, direct.len() as u64, stage);
        made.map(PyStagingPlan::from).map_err(to_py_err)
    }

    /// What ``staging_plan`` would count (``StagingCounts``), without building it.
    ///
    /// :param src_pages: As in ``descriptors``.
    /// :param dst_pages: The destination pages they pair with, as many.
    /// :param buffers: As in ``descriptors``.
    /// :param chunk_bytes: The wire hop in chunks of at most this many bytes (one descriptor
    ///     each); None: one transfer.
    #[pyo3(signature = (src_pages, dst_pages, *, buffers=None, chunk_bytes=None))]
    fn staging_counts<'py>(
        &self,
        py: Python<'py>,
        src_pages: &Bound<'py, PyAny>,
        dst_pages: &Bound<'py, PyAny>,
        buffers: Option<&Bound<'py, PyAny>>,
        chunk_bytes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let convert = || -> Converted<_> {
            Ok((
                u64_column(src_pages, "src_pages")?,
                u64_column(dst_pages, "dst_pages")?,
                selection(buffers)?,
                optional_u64(chunk_bytes, "chunk_bytes")?,
            ))
        };
        let (src, dst, chosen, chunk) = convert().map_err(to_py_err)?;
        let request = || self.inner.staging_counts((&src, &dst), &chosen, chunk);
        let made = detach_above(py, self.inner.descriptor_count(src.len(), &chosen), request);
        counts_object(py, made.map_err(to_py_err)?)
    }

    /// ``staging_counts`` of ``pages`` pages scattered on both sides (no run continues), one
    /// transfer, in constant time: what a router weighs before any page is chosen.
    ///
    /// :param pages: Pages the request moves on each side.
    /// :param buffers: As in ``descriptors``.
    #[pyo3(signature = (pages, *, buffers=None))]
    fn scattered_page_counts<'py>(
        &self,
        py: Python<'py>,
        pages: &Bound<'py, PyAny>,
        buffers: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let convert = || -> Converted<_> { Ok((to_u64(pages, "pages")?, selection(buffers)?)) };
        let (pages, chosen) = convert().map_err(to_py_err)?;
        let counts = self.inner.scattered_page_counts(pages, &chosen);
        counts_object(py, counts.map_err(to_py_err)?)
    }

    /// What ``token_staging_plan`` would count, without building its columns.
    ///
    /// :param src_slots: As in ``token_descriptors``.
    /// :param dst_slots: As in ``token_descriptors``.
    /// :param buffers: As in ``descriptors``.
    /// :param chunk_bytes: The wire hop in chunks of at most this many bytes (one descriptor
    ///     each); None: one transfer.
    #[pyo3(signature = (src_slots, dst_slots, *, buffers=None, chunk_bytes=None))]
    fn token_staging_counts<'py>(
        &self,
        py: Python<'py>,
        src_slots: &Bound<'py, PyAny>,
        dst_slots: &Bound<'py, PyAny>,
        buffers: Option<&Bound<'py, PyAny>>,
        chunk_bytes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let chunk = optional_u64(chunk_bytes, "chunk_bytes").map_err(to_py_err)?;
        let chosen = selection(buffers).map_err(to_py_err)?;
        let whole = TokenSlice::default();
        let direct = self.direct_from_slots(py, (src_slots, dst_slots), &chosen, true, &whole)?;
        let count = || StagingCounts::of(&direct, chunk);
        let made = detach_above(py, direct.len() as u64, count);
        counts_object(py, made.map_err(to_py_err)?)
    }

    /// NIXL's prepped lists for this pair, made once per peer: (local, remote) N x 5 uint64
    /// arrays of ``(address, length, device 0, page stride, pages)`` rows for
    /// ``prep_xfer_dlist(..., "DRAM")``, one row per fragment and page row, checked against
    /// the limits.
    ///
    /// :param src_capacity_pages: Pages each source buffer holds.
    /// :param dst_capacity_pages: Pages each destination buffer holds.
    fn nixl_prepped_lists<'py>(
        &self,
        py: Python<'py>,
        src_capacity_pages: &Bound<'py, PyAny>,
        dst_capacity_pages: &Bound<'py, PyAny>,
    ) -> PyResult<Pair<'py, PyArray2<u64>>> {
        let capacity = |v, name| to_u64(v, name).map_err(to_py_err);
        let src = capacity(src_capacity_pages, "src_capacity_pages")?;
        let dst = capacity(dst_capacity_pages, "dst_capacity_pages")?;
        let lists = self.inner.prepped_lists(src, dst).map_err(to_py_err)?;
        Ok((strided(py, lists.src)?, strided(py, lists.dst)?))
    }

    /// One request as int32 indices into ``nixl_prepped_lists(src_capacity_pages,
    /// dst_capacity_pages)``, for ``make_prepped_xfer``: (local, remote), in descriptor order.
    ///
    /// :param src_pages: As in ``descriptors``.
    /// :param dst_pages: The destination pages they pair with, as many.
    /// :param src_capacity_pages: Pages each source buffer holds, as the lists were made.
    /// :param dst_capacity_pages: Pages each destination buffer holds, as the lists were made.
    /// :param buffers: As in ``descriptors``.
    #[pyo3(signature = (src_pages, dst_pages, src_capacity_pages, dst_capacity_pages, *, buffers=None))]
    fn nixl_prepped_indices<'py>(
        &self,
        py: Python<'py>,
        src_pages: &Bound<'py, PyAny>,
        dst_pages: &Bound<'py, PyAny>,
        src_capacity_pages: &Bound<'py, PyAny>,
        dst_capacity_pages: &Bound<'py, PyAny>,
        buffers: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Pair<'py, PyArray1<i32>>> {
        let convert = || -> Converted<_> {
            Ok((
                u64_column(src_pages, "src_pages")?,
                u64_column(dst_pages, "dst_pages")?,
                to_u64(src_capacity_pages, "src_capacity_pages")?,
                to_u64(dst_capacity_pages, "dst_capacity_pages")?,
                selection(buffers)?,
            ))
        };
        let (src, dst, src_cap, dst_cap, chosen) = convert().map_err(to_py_err)?;
        let request = || {
            self.inner
                .prepped_indices(&src, &dst, &chosen, (src_cap, dst_cap))
        };
        // As many entries as `descriptors` makes: released on the same large requests.
        let made = detach_above(py, self.inner.descriptor_count(src.len(), &chosen), request);
        let (local, remote) = made.map_err(to_py_err)?;
        Ok((local.into_pyarray(py), remote.into_pyarray(py)))
    }

    /// The fragments, as ``TransferFragment`` objects (made on each call).
    #[getter]
    fn fragments<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        FragmentFactory::new(py)?.tuple(self.inner.fragments())
    }

    fn __len__(&self) -> usize {
        self.inner.fragments().len()
    }

    /// Whether both were prepared from one parsed fragment list (frames seen before).
    ///
    /// :param other: Another prepared transfer.
    fn shares_fragments_with(&self, other: &Self) -> bool {
        self.inner.shares_fragments(&other.inner)
    }
}

impl PyPrepared {
    /// A slice's direct descriptors from its slot maps. Short int64 maps are read in place
    /// with the GIL held; others are copied, then read without it.
    fn direct_from_slots<'py>(
        &self,
        py: Python<'py>,
        slots: (&Bound<'py, PyAny>, &Bound<'py, PyAny>),
        chosen: &Selection,
        coalesce: bool,
        slice: &TokenSlice,
    ) -> PyResult<Descriptors> {
        self.build_from_slots(
            py,
            slots,
            chosen,
            coalesce,
            slice,
            |p: PlannedTokens<'_>| p.write(),
        )
    }

    /// A slice's descriptors from its slot maps, written by `write` (flat or strided).
    fn build_from_slots<
        'py,
        T: Ungil + Send,
        W: Ungil + Send + Sync + Fn(PlannedTokens<'_>) -> T,
    >(
        &self,
        py: Python<'py>,
        (src_slots, dst_slots): (&Bound<'py, PyAny>, &Bound<'py, PyAny>),
        chosen: &Selection,
        coalesce: bool,
        slice: &TokenSlice,
        write: W,
    ) -> PyResult<T> {
        let in_place = |slots: &Bound<'py, PyAny>| {
            let array = slots.cast::<PyArray1<i64>>().ok()?.try_readonly().ok()?;
            let short = array.as_slice().ok()?.len() <= READ_IN_PLACE_UP_TO;
            short.then_some(array)
        };
        let (src_array, dst_array) = (in_place(src_slots), in_place(dst_slots));
        let slices = (
            src_array.as_ref().and_then(|a| a.as_slice().ok()),
            dst_array.as_ref().and_then(|a| a.as_slice().ok()),
        );
        if let (Some(src), Some(dst)) = slices {
            let planned = self
                .inner
                .plan_token_descriptors(src, dst, chosen, coalesce, slice)
                .map_err(to_py_err)?;
            return Ok(detach_above(py, planned.total(), || write(planned)));
        }
        let convert = || -> Converted<_> {
            Ok((
                i64_column(src_slots, "src_slots")?,
                i64_column(dst_slots, "dst_slots")?,
            ))
        };
        let (src, dst) = convert().map_err(to_py_err)?;
        let request = || {
            self.inner
                .plan_token_descriptors(&src, &dst, chosen, coalesce, slice)
                .map(write)
        };
        let made = detach_above(
            py,
            src.len() as u64 * self.inner.fragments().len() as u64,
            request,
        );
        made.map_err(to_py_err)
    }
}

/// The parsed-frame cache: hits, misses, entries and payload bytes held.
#[pyfunction]
pub fn frame_cache_info() -> (u64, u64, usize, usize) {
    let stats = frame_cache::stats();
    (stats.hits, stats.misses, stats.entries, stats.weight)
}
