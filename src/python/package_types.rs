//! The package's Python classes the binding makes objects of (`TransferFragment`, the layer
//! kinds, `TransferDescriptors`, ...), handed to it once by `pdplan._package_types` when the
//! package is imported. The compiled module never imports the package's modules itself: they
//! import it, so importing them back would be a circle.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

static TYPES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

/// Takes the package's classes by name. The first call wins: objects made before a second
/// call must stay instances of the classes callers hold.
#[pyfunction]
pub fn use_package_types(py: Python<'_>, types: &Bound<'_, PyDict>) -> PyResult<()> {
    // A second call is ignored (the classes stay those of the first).
    let _ = TYPES.set(py, types.copy()?.unbind());
    Ok(())
}

/// The package's class `name`, as handed over by `use_package_types`.
pub fn package_type<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let found = TYPES
        .get(py)
        .map(|types| types.bind(py).get_item(name))
        .transpose()?
        .flatten();
    found.ok_or_else(|| {
        pyo3::exceptions::PyImportError::new_err(format!(
            "pdplan._core needs the class {name}, which pdplan hands it on import: import \
             pdplan (not pdplan._core alone) first"
        ))
    })
}
