//! The descriptor form that moves a request soonest through an engine: flat descriptors,
//! strided lists (NIXL 1.5's N x 5 rows) or a staging plan, each timed by the cost model with
//! what the engine takes to post it; and the line a calibration fits through its timings.
//!
//! A strided list costs the engine a row each (an entry to prepare and post) and a block each
//! (the work of moving one block of a row, which a transport may or may not do at once); flat
//! descriptors cost `per_descriptor_s` each. Each form's time is the wire's roofline: the
//! longer of that posting cost and the bytes' time.

use crate::cost::CostModel;
use crate::error::{bail, PlanResult};
use crate::staging::StagingCounts;

/// What posting a strided list costs an engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StridedCosts {
    pub per_row_s: f64,
    pub per_block_s: f64,
}

impl StridedCosts {
    /// Refuses costs that make no estimate: each finite and at least 0.
    pub fn new(per_row_s: f64, per_block_s: f64) -> PlanResult<Self> {
        for (name, cost) in [("per_row_s", per_row_s), ("per_block_s", per_block_s)] {
            if !(cost.is_finite() && cost >= 0.0) {
                bail!("{name} must be a finite number of seconds, at least 0, got {cost}");
            }
        }
        Ok(Self {
            per_row_s,
            per_block_s,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Flat,
    Strided,
    Staging,
}

impl Form {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Flat => "flat",
            Self::Strided => "strided",
            Self::Staging => "staging",
        }
    }
}

/// Each form's seconds (None where the engine does not take the form), and the form of least
/// time: of forms that tie, the one posting least, then flat (the default form), then strided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FormTimes {
    pub flat_s: f64,
    pub strided_s: Option<f64>,
    pub staging_s: Option<f64>,
    pub form: Form,
}

/// u64 counts as f64: exact below 2^53, and a cost needs no more.
#[allow(clippy::cast_precision_loss, reason = "counts far below 2^53")]
fn real(n: u64) -> f64 {
    n as f64
}

/// The forms of one request: `counts` its flat descriptors, bytes and staging plan; `strided`
/// its strided list's (rows, blocks) where the engine takes strided lists; `staging` whether
/// the runtime can stage it.
pub fn cheapest(
    model: &CostModel,
    costs: &StridedCosts,
    counts: &StagingCounts,
    strided: Option<(u64, u64)>,
    staging: bool,
) -> FormTimes {
    let bytes_s = real(counts.bytes) / model.network_bytes_per_s;
    let flat_posting = real(counts.direct) * model.per_descriptor_s;
    let strided_posting = strided
        .map(|(rows, blocks)| real(rows) * costs.per_row_s + real(blocks) * costs.per_block_s);
    let strided_s = strided_posting.map(|posting| posting.max(bytes_s));
    let staging_s = staging.then(|| model.estimate(counts).staging_s);
    let flat_s = flat_posting.max(bytes_s);
    // Least time; where times tie (bytes bound both), least posting: the engine's work beside
    // the bytes. Ties within rounding keep the earlier form (flat, the default, first).
    let less = |a: f64, b: f64| a < b * (1.0 - 1e-9);
    let mut best = (Form::Flat, flat_s, flat_posting);
    let others = [
        (
            Form::Strided,
            strided_s,
            strided_posting.unwrap_or(f64::INFINITY),
        ),
        (Form::Staging, staging_s, staging_s.unwrap_or(f64::INFINITY)),
    ];
    for (form, seconds, posting) in others {
        let Some(seconds) = seconds else { continue };
        if less(seconds, best.1) || (!less(best.1, seconds) && less(posting, best.2)) {
            best = (form, seconds, posting);
        }
    }
    FormTimes {
        flat_s,
        strided_s,
        staging_s,
        form: best.0,
    }
}

/// The least-squares line `seconds = fixed + count * per_item` through timings at several
/// counts: `(fixed, per_item)`, each at least 0 (a timing's noise never makes a cost
/// negative). Refuses fewer than two distinct counts and timings that are not finite.
pub fn fit_line(samples: &[(u64, f64)]) -> PlanResult<(f64, f64)> {
    if let Some(&(count, s)) = samples.iter().find(|(_, s)| !(s.is_finite() && *s >= 0.0)) {
        bail!("a timing must be a finite number of seconds, at least 0: {s} at {count}");
    }
    let n = real(samples.len() as u64);
    let mean_x = samples.iter().map(|&(c, _)| real(c)).sum::<f64>() / n;
    let mean_y = samples.iter().map(|&(_, s)| s).sum::<f64>() / n;
    let spread: f64 = samples
        .iter()
        .map(|&(c, _)| (real(c) - mean_x).powi(2))
        .sum();
    if samples.len() < 2 || spread <= 0.0 {
        bail!(
            "a calibration needs timings at two different counts at least, got {}",
            samples.len()
        );
    }
    let covariance: f64 = samples
        .iter()
        .map(|&(c, s)| (real(c) - mean_x) * (s - mean_y))
        .sum();
    let per_item = (covariance / spread).max(0.0);
    Ok(((mean_y - per_item * mean_x).max(0.0), per_item))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> CostModel {
        // 1 µs a descriptor, 1 GB/s wire, 10 GB/s copies, 10 µs a copy.
        CostModel::new((1e-6, 1e9), (1e10, 1e-5, 0.0)).unwrap()
    }

    fn counts(direct: u64, bytes: u64) -> StagingCounts {
        StagingCounts {
            direct,
            transfer: 1,
            gather: direct,
            scatter: direct,
            bytes,
        }
    }

    #[test]
    fn strided_rows_win_where_they_stand_for_many_blocks() {
        let costs = StridedCosts::new(1e-6, 0.25e-6).unwrap();
        // 10,000 small blocks: flat 10 ms; 10 rows of 1,000: 10 µs + 2.5 ms.
        let many = cheapest(
            &model(),
            &costs,
            &counts(10_000, 1000),
            Some((10, 10_000)),
            false,
        );
        assert_eq!(many.form, Form::Strided);
        assert!((many.strided_s.unwrap() - 2.51e-3).abs() < 1e-12);
        // A row a block costs more than a flat descriptor: flat.
        let one = cheapest(
            &model(),
            &costs,
            &counts(100, 1000),
            Some((100, 100)),
            false,
        );
        assert_eq!(one.form, Form::Flat);
        // Without strided lists (Mooncake), flat.
        let none = cheapest(&model(), &costs, &counts(10_000, 1000), None, false);
        assert_eq!((none.form, none.strided_s), (Form::Flat, None));
    }

    #[test]
    fn bytes_bound_forms_tie_and_the_one_posting_least_is_chosen() {
        let costs = StridedCosts::new(1e-6, 0.25e-6).unwrap();
        // 1 GiB at 1 GB/s: about a second whatever the form posts.
        let e = cheapest(&model(), &costs, &counts(10, 1 << 30), Some((1, 10)), false);
        assert_eq!(e.strided_s, Some(e.flat_s));
        // One row (3.5 µs) against ten descriptors (10 µs): strided.
        assert_eq!(e.form, Form::Strided);
        // A row a block posts more (12.5 µs): flat.
        let even = cheapest(
            &model(),
            &costs,
            &counts(10, 1 << 30),
            Some((10, 10)),
            false,
        );
        assert_eq!(even.form, Form::Flat);
    }

    #[test]
    fn a_line_through_exact_timings_is_found_again() {
        let samples: Vec<(u64, f64)> = [16, 256, 4096]
            .iter()
            .map(|&c| (c, 3e-5 + real(c) * 2e-7))
            .collect();
        let (fixed, per) = fit_line(&samples).unwrap();
        assert!((fixed - 3e-5).abs() < 1e-12 && (per - 2e-7).abs() < 1e-15);
        assert!(fit_line(&[(4, 1.0), (4, 2.0)]).is_err());
        assert!(fit_line(&[(4, 1.0)]).is_err());
        assert!(fit_line(&[(4, 1.0), (8, f64::NAN)]).is_err());
        assert!(StridedCosts::new(-1.0, 0.0).is_err());
    }
}
