//! The cost model's choice of descriptor form (`posting` module) and a calibration's fit.

use pyo3::prelude::*;

use super::staging::{counts_of, model_of, CountsTuple, Figures};
use super::to_py_err;
use crate::posting::{cheapest, fit_line, StridedCosts};

/// Each form's seconds and the cheapest form's name.
type Forms = (f64, Option<f64>, Option<f64>, &'static str);

/// Each descriptor form's seconds for a request's staging counts (`posting::cheapest`):
/// `strided` its strided list's (rows, blocks), None where the engine takes none; `staging`
/// whether the runtime may stage it; `figures` as `CostModel._figures` gives them;
/// `strided_costs` (`per_row_s`, `per_block_s`).
#[pyfunction]
pub fn estimate_forms(
    counts: CountsTuple,
    strided: Option<(u64, u64)>,
    staging: bool,
    figures: Figures,
    strided_costs: (f64, f64),
) -> PyResult<Forms> {
    let model = model_of(figures)?;
    let costs = StridedCosts::new(strided_costs.0, strided_costs.1).map_err(to_py_err)?;
    let counts = counts_of(counts);
    let t = cheapest(&model, &costs, &counts, strided, staging);
    Ok((t.flat_s, t.strided_s, t.staging_s, t.form.as_str()))
}

/// Checks a strided list's posting costs (called from `CostModel.__post_init__`).
#[pyfunction]
pub fn check_strided_costs(per_row_s: f64, per_block_s: f64) -> PyResult<()> {
    StridedCosts::new(per_row_s, per_block_s)
        .map(drop)
        .map_err(to_py_err)
}

/// The least-squares line through `(count, seconds)` timings: `(fixed_s, per_item_s)`.
#[pyfunction]
#[pyo3(name = "fit_line")]
#[allow(clippy::needless_pass_by_value, reason = "PyO3 extracts an owned list")]
pub fn fit_timings(samples: Vec<(u64, f64)>) -> PyResult<(f64, f64)> {
    fit_line(&samples).map_err(to_py_err)
}
