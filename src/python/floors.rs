//! The benchmark's floors: what the large-world operations cost at the least, measured on this
//! machine beside pdplan's own times (`benches/compare.py`). Not part of the API.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::convert::{fragments_of, Converted};
use super::objects::{fragment_tuple, model_types, untracked, CollectorPause};
use super::to_py_err;
use crate::error::PlanError;
use crate::fragment::Fragment;
use crate::wire;

/// New `TransferFragment` objects holding the very value objects of `fragments`: making
/// fragment objects through their slots with the values already Python ints, and nothing else
/// (no planning, no conversion). The floor under planning and decoding.
#[pyfunction]
pub fn remake_fragments<'py>(
    py: Python<'py>,
    fragments: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyTuple>> {
    let types = model_types(py)?;
    let slots = types.fragment_slots.as_ref().ok_or_else(|| {
        to_py_err(PlanError::new(
            "TransferFragment's slots did not check out on this Python".to_owned(),
        ))
    })?;
    // As a plan's fragments are made: the collector paused, each fragment untracked.
    let _pause = CollectorPause::start(py);
    fragment_tuple(py, fragments.len(), |index| {
        let fragment = fragments.get_item(index)?;
        match slots.copy(&fragment) {
            Some(copy) => copy.map(untracked),
            None => Err(to_py_err(PlanError::new(
                "remake_fragments takes TransferFragments with every field set".to_owned(),
            ))),
        }
    })
}

/// Fragment lists held as Rust structs, to write their frames with no Python object in the way:
/// the floor under encoding.
#[pyclass(frozen, module = "pdplan._core", name = "FrameFloor")]
pub struct FrameFloor {
    lists: Vec<Vec<Fragment>>,
}

#[pymethods]
impl FrameFloor {
    #[new]
    fn new(py: Python<'_>, lists: &Bound<'_, PyAny>) -> PyResult<Self> {
        let types = model_types(py)?;
        let convert = || -> Converted<_> {
            lists
                .try_iter()
                .map_err(|_| PlanError::new("lists must be iterable".to_owned()))?
                .map(|list| {
                    let list = list.map_err(|e| PlanError::new(e.to_string()))?;
                    fragments_of(&list, "fragments", types)
                })
                .collect()
        };
        Ok(Self {
            lists: convert().map_err(to_py_err)?,
        })
    }

    /// Writes every list's frames, as `encode_transfer_fragments` would (into Rust buffers,
    /// not bytes objects); returns the payload bytes written.
    fn write(&self, py: Python<'_>) -> usize {
        py.detach(|| {
            self.lists
                .iter()
                .map(|list| wire::encode(list).1.len())
                .sum()
        })
    }
}
