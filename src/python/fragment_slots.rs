//! Where `TransferFragment`'s fields sit in its objects. A slotted class keeps each field in a
//! fixed word of the object (`CPython`'s member descriptors load and store that word), so a
//! fragment is built and read word by word, without a name lookup through the class a field.
//! The layout is probed once, on a real instance, and checked: every field is a member
//! descriptor found in exactly one word, and the object holds nothing else. A class that fails
//! the check (another Python, a changed dataclass) is read and built through attributes.

use std::mem::size_of;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyType};

use crate::fragment::FIELD_COUNT;

/// A checked slot layout of one class.
pub struct SlotLayout {
    class: Py<PyType>,
    /// The fields' words in an instance (pointer-sized, from its start), in schema order.
    offsets: [usize; FIELD_COUNT],
    alloc: ffi::allocfunc,
}

impl SlotLayout {
    /// The layout of `class`, whose fields are `names` in schema order, or `None` when the
    /// class does not hold exactly those fields in slots.
    pub fn probe(class: &Bound<'_, PyType>, names: &[Py<PyString>]) -> PyResult<Option<Self>> {
        let py = class.py();
        let word = size_of::<*mut ffi::PyObject>();
        // The object header's words (reference count, type), which no field shares.
        let header = size_of::<ffi::PyObject>() / word;
        let attribute = |name: &str| -> PyResult<isize> { class.getattr(name)?.extract() };
        let plain = attribute("__dictoffset__")? == 0
            && attribute("__weakrefoffset__")? == 0
            && attribute("__itemsize__")? == 0
            && usize::try_from(attribute("__basicsize__")?).ok()
                == Some((header + FIELD_COUNT) * word);
        let member = py.import("types")?.getattr("MemberDescriptorType")?;
        let own = class.getattr("__dict__")?;
        let described = names.iter().all(|name| {
            own.get_item(name)
                .is_ok_and(|descriptor| descriptor.get_type().is(&member))
        });
        if !plain || !described || names.len() != FIELD_COUNT {
            return Ok(None);
        }
        // SAFETY: the slot of a type object is read as CPython documents (`PyType_GetSlot`,
        // part of the stable ABI since 3.10 for every type); `tp_alloc` is never NULL for a
        // class made by a class statement, checked anyway.
        let slot = unsafe { ffi::PyType_GetSlot(class.as_type_ptr(), ffi::Py_tp_alloc) };
        if slot.is_null() {
            return Ok(None);
        }
        // SAFETY: `Py_tp_alloc` holds an `allocfunc` (CPython's `PyType_Slot` table).
        let alloc: ffi::allocfunc = unsafe { std::mem::transmute(slot) };
        let mut layout = Self {
            class: class.clone().unbind(),
            offsets: [0; FIELD_COUNT],
            alloc,
        };
        // One fresh object a field, stored through the attribute protocol, then looked for.
        let probe = layout.empty(py)?;
        let markers = (0..FIELD_COUNT)
            .map(|_| PyDict::new(py).into_any())
            .collect::<Vec<_>>();
        for (name, marker) in names.iter().zip(&markers) {
            // SAFETY: live objects; stores through the class's member descriptor (bypassing a
            // frozen dataclass's `__setattr__`, as `object.__setattr__` does); -1 sets an error.
            let status = unsafe {
                ffi::PyObject_GenericSetAttr(probe.as_ptr(), name.as_ptr(), marker.as_ptr())
            };
            if status != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        for (offset, marker) in layout.offsets.iter_mut().zip(&markers) {
            // SAFETY: every word read lies inside the instance's `__basicsize__` bytes (checked
            // above) after its header: object pointers or NULL.
            let found = (header..header + FIELD_COUNT)
                .filter(|&at| unsafe { word_at(probe.as_ptr(), at).read() } == marker.as_ptr())
                .collect::<Vec<_>>();
            match found.as_slice() {
                [at] => *offset = *at,
                _ => return Ok(None),
            }
        }
        Ok(Some(layout))
    }

    /// A new instance with every field word NULL: the caller fills all of them.
    fn empty<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: the class's own allocator, called as `object.__new__` calls it (no items);
        // it returns a new reference to a zeroed, tracked instance, or NULL with an error set.
        unsafe { Bound::from_owned_ptr_or_err(py, (self.alloc)(self.class.as_ptr().cast(), 0)) }
    }

    /// A new instance holding `values` (schema order), each one referenced anew.
    pub fn build<'py>(
        &self,
        py: Python<'py>,
        values: &[Bound<'py, PyAny>; FIELD_COUNT],
    ) -> PyResult<Bound<'py, PyAny>> {
        let obj = self.empty(py)?;
        for (&offset, value) in self.offsets.iter().zip(values) {
            // SAFETY: `offset` is a field word of this class's instances (probed), NULL in a
            // fresh one; it takes a new reference, which the instance's dealloc releases.
            unsafe { word_at(obj.as_ptr(), offset).write(value.clone().into_ptr()) };
        }
        Ok(obj)
    }

    /// A new instance holding the very objects `obj` holds, when `obj` is exactly of this class
    /// with every field set: copying the words, one new reference each.
    pub fn copy<'py>(&self, obj: &Bound<'py, PyAny>) -> Option<PyResult<Bound<'py, PyAny>>> {
        if !self.holds(obj) {
            return None;
        }
        // SAFETY: `obj` is exactly of the probed class: each offset is one of its field words.
        let words = self
            .offsets
            .map(|offset| unsafe { word_at(obj.as_ptr(), offset).read() });
        if words.iter().any(|word| word.is_null()) {
            return None;
        }
        // SAFETY: live objects `obj` references, read just now; the new references keep them
        // alive through the allocation below (which may run a collection, and finalizers).
        let values = words.map(|word| unsafe { Bound::from_borrowed_ptr(obj.py(), word) });
        let copy = match self.empty(obj.py()) {
            Ok(copy) => copy,
            Err(error) => return Some(Err(error)),
        };
        for (&offset, value) in self.offsets.iter().zip(values) {
            // SAFETY: `offset` is a field word of the fresh copy, NULL until now; it takes the
            // reference `value` hands over.
            unsafe { word_at(copy.as_ptr(), offset).write(value.into_ptr()) };
        }
        Some(Ok(copy))
    }

    /// Whether `obj` is exactly of this class, so that `field` reads its slots.
    pub fn holds(&self, obj: &Bound<'_, PyAny>) -> bool {
        // SAFETY: the type pointer of a live object.
        unsafe { ffi::Py_TYPE(obj.as_ptr()) == self.class.as_ptr().cast() }
    }

    /// Field `index` (schema order) of `obj`: `Known` when it holds the object `known`,
    /// else the object (a new reference), or `Unread` when `obj` is not exactly of this class
    /// or the field was never set (read it through attributes, which says what is missing).
    /// Each call reads the slot anew: Python code run between calls may have changed it.
    pub fn field<'py>(
        &self,
        obj: &Bound<'py, PyAny>,
        index: usize,
        known: Option<&Bound<'py, PyAny>>,
    ) -> SlotRead<'py> {
        let Some(&offset) = self.offsets.get(index).filter(|_| self.holds(obj)) else {
            return SlotRead::Unread;
        };
        // SAFETY: `obj` is exactly of the probed class, so `offset` is one of its field words:
        // an object pointer, or NULL for a field never set.
        let word = unsafe { word_at(obj.as_ptr(), offset).read() };
        if word.is_null() {
            SlotRead::Unread
        } else if known.is_some_and(|k| k.as_ptr() == word) {
            SlotRead::Known
        } else {
            // SAFETY: a live object the instance references, read just now; the new reference
            // keeps it alive whatever happens to the field afterwards.
            SlotRead::Value(unsafe { Bound::from_borrowed_ptr(obj.py(), word) })
        }
    }
}

/// One field as `SlotLayout::field` finds it.
pub enum SlotRead<'py> {
    /// The object the caller already knows.
    Known,
    Value(Bound<'py, PyAny>),
    Unread,
}

/// Word `index` of an object, counted from its start. The caller keeps `index` inside the object.
unsafe fn word_at(obj: *mut ffi::PyObject, index: usize) -> *mut *mut ffi::PyObject {
    // SAFETY: the caller's promise; objects are pointer-aligned, so every word is.
    unsafe { obj.cast::<*mut ffi::PyObject>().add(index) }
}
