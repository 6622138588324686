//! Core values -> Python objects of `pdplan._model`.

use std::ptr;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};

use numpy::ndarray::Array2;
use numpy::IntoPyArray;
use pyo3::exceptions::PyValueError;

use super::fragment_slots::SlotLayout;
use super::package_types::package_type;
use crate::descriptors::{Descriptors, Strided};
use crate::fragment::{FieldValue, Fragment, FIELDS, FIELD_COUNT};
use crate::layout::{BufferKind, BufferLayout};
use crate::planner::{PlanKind, RankPlan};

/// The dataclasses of `pdplan._model`, imported once.
pub struct ModelTypes {
    pub fragment: Py<PyType>,
    rank_plan: Py<PyType>,
    buffer_layout: Py<PyType>,
    /// `BufferKind` members in `BufferKind::ALL` order.
    kinds: Vec<Py<PyAny>>,
    /// Where a `TransferFragment`'s fields sit, when its layout checks out.
    pub fragment_slots: Option<SlotLayout>,
}

static MODEL_TYPES: PyOnceLock<ModelTypes> = PyOnceLock::new();

/// The fragment schema's field names, interned once, in `FIELDS` order.
pub fn field_names(py: Python<'_>) -> &[Py<PyString>] {
    static NAMES: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();
    NAMES.get_or_init(py, || {
        FIELDS
            .iter()
            .map(|field| PyString::intern(py, field.name).unbind())
            .collect()
    })
}

pub fn model_types(py: Python<'_>) -> PyResult<&ModelTypes> {
    MODEL_TYPES.get_or_try_init(py, || {
        let kind_type = package_type(py, "BufferKind")?;
        let kinds = BufferKind::ALL
            .iter()
            .map(|kind| kind_type.call1((kind.as_str(),)).map(Bound::unbind))
            .collect::<PyResult<Vec<_>>>()?;
        let fragment = package_type(py, "TransferFragment")?.cast_into::<PyType>()?;
        Ok(ModelTypes {
            fragment_slots: SlotLayout::probe(&fragment, field_names(py))?,
            fragment: fragment.unbind(),
            rank_plan: package_type(py, "RankTransferPlan")?
                .cast_into::<PyType>()?
                .unbind(),
            buffer_layout: package_type(py, "BufferLayout")?
                .cast_into::<PyType>()?
                .unbind(),
            kinds,
        })
    })
}

impl ModelTypes {
    pub fn kind_object<'py>(
        &self,
        py: Python<'py>,
        kind: BufferKind,
    ) -> PyResult<Bound<'py, PyAny>> {
        let position = BufferKind::ALL.iter().position(|k| *k == kind);
        position
            .and_then(|p| self.kinds.get(p))
            .map(|member| member.bind(py).clone())
            .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("BufferKind member missing"))
    }

    /// The core kind of a `BufferKind` member, by identity (the common, fast case).
    pub fn kind_of(&self, obj: &Bound<'_, PyAny>) -> Option<BufferKind> {
        self.kinds
            .iter()
            .position(|member| member.as_ptr() == obj.as_ptr())
            .and_then(|p| BufferKind::ALL.get(p).copied())
    }
}

/// `RankTransferPlan` fields in dataclass order (a test holds this to `dataclasses.fields`).
pub const RANK_PLAN_FIELDS: [&str; 7] = [
    "plan_kind",
    "target_dp_group",
    "target_prefill_ranks",
    "required_prefill_response_num",
    "fragments_by_prefill_rank",
    "required_dst_info_num_by_prefill_rank",
    "notify_prefill_ranks",
];

/// Builds `TransferFragment` objects without running `__init__` (the values come validated
/// from the core): `object.__new__` and a generic attribute store a field, through the C slots,
/// instead of a Python-level call and one frozen-dataclass setter a field. Values equal to the
/// previous fragment's are shared rather than made again: consecutive fragments of a plan
/// differ in one or two fields.
pub struct FragmentFactory<'py> {
    py: Python<'py>,
    types: &'py ModelTypes,
    cls: Bound<'py, PyType>,
    names: Vec<Bound<'py, PyString>>,
    /// The collector stays off while a batch of fragments is made (see `CollectorPause`).
    _pause: CollectorPause<'py>,
    /// The previous fragment's field values and their objects (reused where unchanged).
    last: Option<Fragment>,
    values: [Bound<'py, PyAny>; FIELD_COUNT],
}

impl<'py> FragmentFactory<'py> {
    pub fn new(py: Python<'py>) -> PyResult<Self> {
        let types = model_types(py)?;
        let cls = types.fragment.bind(py).clone();
        Ok(Self {
            py,
            types,
            cls,
            names: field_names(py).iter().map(|n| n.bind(py).clone()).collect(),
            _pause: CollectorPause::start(py),
            last: None,
            values: std::array::from_fn(|_| py.None().into_bound(py)),
        })
    }

    /// Brings `self.values` up to `f`, making new Python values only for changed fields.
    fn update_values(&mut self, f: &Fragment) -> PyResult<()> {
        let changed = self
            .last
            .as_ref()
            .map_or(u64::MAX, |last| last.differing_fields(f));
        if changed == 0 {
            return Ok(());
        }
        // Only the changed fields: consecutive fragments differ in one or two.
        let mut pending = changed;
        while pending != 0 {
            let index = pending.trailing_zeros() as usize;
            pending &= pending - 1;
            let (Some(value), Some(slot)) = (f.field_value(index), self.values.get_mut(index))
            else {
                continue;
            };
            *slot = object_of(self.py, self.types, value)?;
        }
        self.last = Some(*f);
        Ok(())
    }

    pub fn make(&mut self, f: &Fragment) -> PyResult<Bound<'py, PyAny>> {
        self.update_values(f)?;
        let fragment = match &self.types.fragment_slots {
            Some(slots) => slots.build(self.py, &self.values)?,
            None => frozen_instance(&self.cls, self.names.iter().zip(self.values.iter()))?,
        };
        Ok(untracked(fragment))
    }

    pub fn tuple(&mut self, fragments: &[Fragment]) -> PyResult<Bound<'py, PyTuple>> {
        fragment_tuple(self.py, fragments.len(), |index| {
            match fragments.get(index) {
                Some(f) => self.make(f),
                None => Err(pyo3::exceptions::PyIndexError::new_err("no such fragment")),
            }
        })
    }
}

/// A tuple of `len` fragments made here, `make(i)` the `i`th, untracked like them: its items
/// never change and are in no cycle (see `untracked`), so the collector need not walk it, and
/// a dict holding only such tuples stays untracked too (`CPython` tracks a dict once it holds a
/// tracked value).
pub fn fragment_tuple<'py>(
    py: Python<'py>,
    len: usize,
    mut make: impl FnMut(usize) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let size = ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("too many fragments"))?;
    // SAFETY: a new tuple of `size` NULL items (or NULL with an error set); each item is set
    // exactly once below, before the tuple is handed to any Python code.
    let tuple = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyTuple_New(size))? };
    for (at, index) in (0..size).zip(0..len) {
        let item = make(index)?;
        // SAFETY: `at` < `size` of this fresh tuple; `PyTuple_SetItem` steals the new
        // reference `into_ptr` hands over.
        if unsafe { ffi::PyTuple_SetItem(tuple.as_ptr(), at, item.into_ptr()) } != 0 {
            return Err(PyErr::fetch(py));
        }
    }
    // SAFETY: a live tuple (a GC type), GIL held, as CPython's own `_PyTuple_MaybeUntrack`.
    unsafe { ffi::PyObject_GC_UnTrack(tuple.as_ptr().cast()) };
    tuple.cast_into::<PyTuple>().map_err(Into::into)
}

/// A fragment made here, untracked by the cyclic collector. It holds ints, None and
/// `BufferKind` members, none of which can reach it: it is in no reference cycle, so the
/// collector need not walk it (`CPython` untracks tuples of such values for the same reason).
/// Walking hundreds of thousands of them was most of a large plan's cost. A cycle forced into
/// one through `object.__setattr__` is never collected, only freed by reference counting.
pub fn untracked(fragment: Bound<'_, PyAny>) -> Bound<'_, PyAny> {
    // SAFETY: a live object of a GC type (slotted classes are), GIL held (the `Bound`);
    // untracking an object its type's dealloc frees is what CPython does for tuples.
    unsafe { ffi::PyObject_GC_UnTrack(fragment.as_ptr().cast()) };
    fragment
}

/// A field value as a Python object.
fn object_of<'py>(
    py: Python<'py>,
    types: &ModelTypes,
    value: FieldValue,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        FieldValue::Int(v) => v.into_pyobject(py)?.into_any(),
        FieldValue::OptionalInt(v) => v.into_pyobject(py)?.into_any(),
        FieldValue::Kind(kind) => types.kind_object(py, kind)?,
    })
}

/// Keeps the cyclic garbage collector from running while a batch of fragments is made: every
/// allocation counts toward the next collection even of objects untracked right after, so a
/// large plan would trigger hundreds of collections mid-batch, each walking every tracked object
/// of the young generation. The next collection after the batch runs once. No other thread runs
/// meanwhile: the batch is made holding the GIL (the pause holds its token, so it cannot leave
/// the call) and runs no Python code.
pub struct CollectorPause<'py> {
    was_enabled: bool,
    _gil: Python<'py>,
}

impl<'py> CollectorPause<'py> {
    pub fn start(py: Python<'py>) -> Self {
        // SAFETY: the GIL is held (`py`); `PyGC_Disable` only clears the collector's enabled
        // flag and returns whether it was set.
        let was_enabled = unsafe { ffi::PyGC_Disable() } == 1;
        Self {
            was_enabled,
            _gil: py,
        }
    }
}

impl Drop for CollectorPause<'_> {
    fn drop(&mut self) {
        if self.was_enabled {
            // SAFETY: the pause holds a GIL token and cannot be sent to another thread, so the
            // GIL is held here too; `PyGC_Enable` only sets the enabled flag back.
            unsafe { ffi::PyGC_Enable() };
        }
    }
}

/// A frozen dataclass instance built as `object.__new__(cls)` followed by
/// `object.__setattr__(obj, name, value)` for each field, through the C slots: the Python-level
/// calls and the dataclass's `__init__` are what make object creation slow.
fn frozen_instance<'py, 'a>(
    cls: &Bound<'py, PyType>,
    fields: impl Iterator<Item = (&'a Bound<'py, PyString>, &'a Bound<'py, PyAny>)>,
) -> PyResult<Bound<'py, PyAny>>
where
    'py: 'a,
{
    let py = cls.py();
    let no_args = PyTuple::empty(py);
    // SAFETY: `cls` is a plain Python class (one of our dataclasses) whose `tp_new` is the
    // inherited `object.__new__`; it is called with an empty argument tuple and no keywords, as
    // `object.__new__(cls)` would be. The result is an owned reference or NULL with an error
    // set, which `from_owned_ptr_or_err` turns into a `PyErr`.
    let obj = unsafe {
        let slot = ffi::PyType_GetSlot(cls.as_type_ptr(), ffi::Py_tp_new);
        if slot.is_null() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "class cannot be instantiated",
            ));
        }
        let tp_new: ffi::newfunc = std::mem::transmute(slot);
        Bound::from_owned_ptr_or_err(
            py,
            tp_new(cls.as_type_ptr(), no_args.as_ptr(), ptr::null_mut()),
        )?
    };
    for (name, value) in fields {
        // SAFETY: all three are live objects; `PyObject_GenericSetAttr` stores the value in the
        // instance (taking its own reference) and returns -1 with an error set on failure. Like
        // `object.__setattr__`, it bypasses the frozen dataclass's `__setattr__`.
        let status =
            unsafe { ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) };
        if status != 0 {
            return Err(PyErr::fetch(py));
        }
    }
    Ok(obj)
}

/// `BufferLayout` fields in dataclass order (a test holds this to `dataclasses.fields`).
pub const BUFFER_LAYOUT_FIELDS: [&str; 16] = [
    "buffer_index",
    "buffer_kind",
    "logical_axis",
    "logical_size",
    "page_size",
    "bytes_per_logical_unit",
    "item_stride_bytes",
    "tp_replica_group_size",
    "rows_per_page",
    "logical_parts",
    "layer",
    "sliding_window",
    "attention_chunk_size",
    "page_bytes",
    "logical_part_groups",
    "token_pieces",
];

/// A `BufferLayout` the core made and validated: built without running `__post_init__`, which
/// would only check it again.
pub fn buffer_layout_object<'py>(py: Python<'py>, b: &BufferLayout) -> PyResult<Bound<'py, PyAny>> {
    let types = model_types(py)?;
    let parts = b.logical_parts.given();
    let groups = b.logical_parts.groups();
    let optional_tuple = |values: &[u64]| -> PyResult<Bound<'py, PyAny>> {
        Ok(if values.is_empty() {
            py.None().into_bound(py)
        } else {
            PyTuple::new(py, values)?.into_any()
        })
    };
    let values: [Bound<'py, PyAny>; 16] = [
        b.buffer_index.into_pyobject(py)?.into_any(),
        types.kind_object(py, b.buffer_kind)?,
        PyString::new(py, b.logical_axis.as_str()).into_any(),
        b.logical_size.into_pyobject(py)?.into_any(),
        b.page_size.into_pyobject(py)?.into_any(),
        b.bytes_per_logical_unit.into_pyobject(py)?.into_any(),
        b.item_stride_bytes.into_pyobject(py)?.into_any(),
        b.tp_replica_group_size.into_pyobject(py)?.into_any(),
        b.rows_per_page.into_pyobject(py)?.into_any(),
        optional_tuple(parts)?,
        b.layer.into_pyobject(py)?.into_any(),
        b.sliding_window.into_pyobject(py)?.into_any(),
        b.attention_chunk_size.into_pyobject(py)?.into_any(),
        b.page_bytes.into_pyobject(py)?.into_any(),
        optional_tuple(groups)?,
        optional_tuple(b.token_pieces.given())?,
    ];
    let names = BUFFER_LAYOUT_FIELDS.map(|name| PyString::intern(py, name));
    frozen_instance(
        types.buffer_layout.bind(py),
        names.iter().zip(values.iter()),
    )
}

/// Three columns as `pdplan.TransferDescriptors`: the one way both descriptor entry points
/// (`transfer_descriptors`, `PreparedTransfer.descriptors`) hand them out.
pub fn descriptors_object(py: Python<'_>, built: Descriptors) -> PyResult<Bound<'_, PyAny>> {
    // `tuple.__new__(TransferDescriptors, columns)`: what the NamedTuple's own `__new__` does,
    // without running its Python frame (a request's fixed cost).
    static NEW: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();
    let (new, cls) = NEW.get_or_try_init(py, || -> PyResult<_> {
        let cls = package_type(py, "TransferDescriptors")?;
        let new = py.get_type::<PyTuple>().getattr("__new__")?;
        Ok((new.unbind(), cls.unbind()))
    })?;
    let columns = (
        built.src_addrs.into_pyarray(py),
        built.dst_addrs.into_pyarray(py),
        built.lengths.into_pyarray(py),
    );
    new.bind(py).call1((cls.bind(py), columns))
}

/// Strided entries as `pdplan.StridedDescriptors`: two N x 5 uint64 arrays of
/// `(address, length, device 0, stride, count)` rows.
pub fn strided_object(py: Python<'_>, built: Strided) -> PyResult<Bound<'_, PyAny>> {
    // `tuple.__new__(StridedDescriptors, (src, dst))`, as `descriptors_object` does.
    static NEW: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();
    let (new, cls) = NEW.get_or_try_init(py, || -> PyResult<_> {
        let cls = package_type(py, "StridedDescriptors")?;
        let new = py.get_type::<PyTuple>().getattr("__new__")?;
        Ok((new.unbind(), cls.unbind()))
    })?;
    let n = built.len();
    // Rows of five, flattened in place: each array takes its memory without a copy.
    let rows = |list: Vec<[u64; 5]>| {
        Array2::from_shape_vec((n, 5), list.into_flattened())
            .map(|a| a.into_pyarray(py))
            .map_err(|e| PyValueError::new_err(format!("strided rows: {e}")))
    };
    let columns = (rows(built.src)?, rows(built.dst)?);
    new.bind(py).call1((cls.bind(py), columns))
}

pub fn rank_plan_object<'py>(py: Python<'py>, plan: &RankPlan) -> PyResult<Bound<'py, PyAny>> {
    let types = model_types(py)?;
    let mut factory = FragmentFactory::new(py)?;
    let fragments = PyDict::new(py);
    let fanouts = PyDict::new(py);
    let mut ranks = Vec::with_capacity(plan.sources.len());
    for source in &plan.sources {
        ranks.push(source.prefill_rank);
        if plan.kind == PlanKind::Fragmented {
            fragments.set_item(source.prefill_rank, factory.tuple(&source.fragments)?)?;
        }
        fanouts.set_item(source.prefill_rank, source.fanout)?;
    }
    let values: [Bound<'py, PyAny>; 7] = [
        PyString::new(py, plan.kind.as_str()).into_any(),
        plan.target_dp_group.into_pyobject(py)?.into_any(),
        PyTuple::new(py, &ranks)?.into_any(),
        ranks.len().into_pyobject(py)?.into_any(),
        fragments.into_any(),
        fanouts.into_any(),
        PyTuple::new(py, &plan.notify)?.into_any(),
    ];
    let names = RANK_PLAN_FIELDS.map(|name| PyString::intern(py, name));
    frozen_instance(types.rank_plan.bind(py), names.iter().zip(values.iter()))
}
