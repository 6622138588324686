//! Frames already encoded, by the identity of the fragments they were encoded from: the decode
//! side encodes the same fragment list for every request to the same prefill rank.
//!
//! The key is the exact sequence of fragment objects (their addresses), and the cache holds a
//! strong reference to each of them, so no address can be reused by another object while its
//! entry lives; fragments are frozen `TransferFragment`s (anything else is never cached), so
//! the same objects in the same order always encode to the same frames.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::lru::Shared;

/// Most fragment lists kept, and fragment objects kept alive by the cache in all.
use crate::limits::{ENCODE_CACHE_ENTRIES as MAX_ENTRIES, ENCODE_CACHE_ITEMS as MAX_ITEMS};

struct Entry {
    items: Vec<Py<PyAny>>,
    version: Py<PyBytes>,
    payload: Py<PyBytes>,
}

/// Weighed by the fragment objects each entry keeps alive.
static CACHE: Shared<Entry> = Shared::new(MAX_ENTRIES, MAX_ITEMS);

/// The addresses of a list's or tuple's items when every one is a `TransferFragment` (exact
/// type), else `None` (not cacheable).
pub fn fragment_addresses(
    seq: &Bound<'_, PyAny>,
    fragment_type: &Bound<'_, PyAny>,
) -> Option<Vec<usize>> {
    let wanted = fragment_type.as_ptr().cast::<pyo3::ffi::PyTypeObject>();
    let collect = |items: &mut dyn Iterator<Item = Bound<'_, PyAny>>| {
        items
            .map(|item| {
                // SAFETY: the type pointer of a live object.
                let exact = unsafe { pyo3::ffi::Py_TYPE(item.as_ptr()) } == wanted;
                exact.then(|| item.as_ptr() as usize)
            })
            .collect::<Option<Vec<usize>>>()
    };
    if let Ok(tuple) = seq.cast::<PyTuple>() {
        // Borrowed items (no reference counting): the tuple holds them and no code runs here.
        (0..tuple.len())
            .map(|index| {
                let item = tuple.get_borrowed_item(index).ok()?;
                // SAFETY: the type pointer of a live object.
                let exact = unsafe { pyo3::ffi::Py_TYPE(item.as_ptr()) } == wanted;
                exact.then(|| item.as_ptr() as usize)
            })
            .collect()
    } else if let Ok(list) = seq.cast::<PyList>() {
        collect(&mut list.iter())
    } else {
        None
    }
}

fn hash_of(addresses: &[usize]) -> u64 {
    // A multiply-rotate mix (FxHash's): a few instructions an address. Only the bucket depends
    // on it; a hit is confirmed address by address.
    addresses
        .iter()
        .fold(addresses.len() as u64, |hash, &address| {
            (hash.rotate_left(5) ^ address as u64).wrapping_mul(0x517c_c1b7_2722_0a95)
        })
}

/// The frames encoded before from exactly these fragment objects, if kept.
pub fn get<'py>(
    py: Python<'py>,
    addresses: &[usize],
) -> Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let mut cache = CACHE.lock();
    let entry = cache.get(hash_of(addresses), |e| {
        e.items.len() == addresses.len()
            && e.items
                .iter()
                .zip(addresses)
                .all(|(item, &a)| item.as_ptr() as usize == a)
    })?;
    Some((
        entry.version.bind(py).clone(),
        entry.payload.bind(py).clone(),
    ))
}

/// Keeps the frames of `items` (the objects whose addresses are `addresses`).
pub fn insert(
    items: &Bound<'_, PyAny>,
    addresses: &[usize],
    version: &Bound<'_, PyBytes>,
    payload: &Bound<'_, PyBytes>,
) -> PyResult<()> {
    let kept: Vec<Py<PyAny>> = items
        .try_iter()?
        .map(|item| item.map(Bound::unbind))
        .collect::<PyResult<_>>()?;
    let weight = kept.len();
    let entry = Entry {
        items: kept,
        version: version.clone().unbind(),
        payload: payload.clone().unbind(),
    };
    let evicted = CACHE.lock().insert(hash_of(addresses), entry, weight);
    // Released outside the lock: dropping the last reference to an object may run Python code.
    drop(evicted);
    Ok(())
}

/// (entries, fragment objects held).
pub fn stats() -> (usize, usize) {
    let stats = CACHE.lock().stats();
    (stats.entries, stats.weight)
}
