//! The cost model that chooses between moving a request directly and staging it.
//!
//! An engine's wire time is a roofline: a NIC posts descriptors and moves bytes at once, so a
//! transfer takes the longer of its descriptors' cost and its bytes' time. A copy (a gather
//! or scatter kernel, or a host pack) costs a fixed start, a cost per segment and its bytes at
//! the copy rate, one after another. Staging is gather, then the wire, then scatter: the sum,
//! not overlapped (a runtime that pipelines chunks does better than this estimate).

use crate::error::{bail, PlanResult};
use crate::staging::StagingCounts;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub per_descriptor_s: f64,
    pub network_bytes_per_s: f64,
    pub copy_bytes_per_s: f64,
    pub per_copy_s: f64,
    pub per_segment_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub direct_s: f64,
    pub staging_s: f64,
    pub gather_s: f64,
    pub wire_s: f64,
    pub scatter_s: f64,
}

impl Estimate {
    pub fn staging_pays(&self) -> bool {
        self.staging_s < self.direct_s
    }
}

/// u64 counts as f64: exact below 2^53, and a cost needs no more.
#[allow(clippy::cast_precision_loss, reason = "counts far below 2^53")]
fn real(n: u64) -> f64 {
    n as f64
}

impl CostModel {
    /// Refuses figures that make no estimate: rates must be positive, costs not negative,
    /// all finite.
    pub fn new(
        (per_descriptor_s, network_bytes_per_s): (f64, f64),
        (copy_bytes_per_s, per_copy_s, per_segment_s): (f64, f64, f64),
    ) -> PlanResult<Self> {
        for (name, rate) in [
            ("network_bytes_per_s", network_bytes_per_s),
            ("copy_bytes_per_s", copy_bytes_per_s),
        ] {
            if !(rate.is_finite() && rate > 0.0) {
                bail!("{name} must be a positive finite rate, got {rate}");
            }
        }
        for (name, cost) in [
            ("per_descriptor_s", per_descriptor_s),
            ("per_copy_s", per_copy_s),
            ("per_segment_s", per_segment_s),
        ] {
            if !(cost.is_finite() && cost >= 0.0) {
                bail!("{name} must be a finite number of seconds, at least 0, got {cost}");
            }
        }
        Ok(Self {
            per_descriptor_s,
            network_bytes_per_s,
            copy_bytes_per_s,
            per_copy_s,
            per_segment_s,
        })
    }

    /// The wire's roofline: the longer of the descriptors' cost and the bytes' time.
    pub fn wire_s(&self, descriptors: u64, bytes: u64) -> f64 {
        (real(descriptors) * self.per_descriptor_s).max(real(bytes) / self.network_bytes_per_s)
    }

    fn copy_s(&self, segments: u64, bytes: u64) -> f64 {
        if segments == 0 {
            return 0.0;
        }
        self.per_copy_s + real(segments) * self.per_segment_s + real(bytes) / self.copy_bytes_per_s
    }

    pub fn estimate(&self, counts: &StagingCounts) -> Estimate {
        let gather_s = self.copy_s(counts.gather, counts.bytes);
        let wire_s = self.wire_s(counts.transfer, counts.bytes);
        let scatter_s = self.copy_s(counts.scatter, counts.bytes);
        Estimate {
            direct_s: self.wire_s(counts.direct, counts.bytes),
            staging_s: gather_s + wire_s + scatter_s,
            gather_s,
            wire_s,
            scatter_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> CostModel {
        // 1 µs a descriptor, 1 GB/s wire, 10 GB/s copies, 10 µs a copy, no segment cost.
        CostModel::new((1e-6, 1e9), (1e10, 1e-5, 0.0)).unwrap()
    }

    #[test]
    fn many_small_descriptors_pay_for_staging_and_few_large_do_not() {
        let small = StagingCounts {
            direct: 100_000,
            transfer: 1,
            gather: 10,
            scatter: 100_000,
            bytes: 25_600_000,
        };
        let e = model().estimate(&small);
        // Direct: 100k descriptors (0.1 s) outweigh 25.6 MB on the wire (25.6 ms).
        assert!((e.direct_s - 0.1).abs() < 1e-12);
        assert!(e.staging_pays(), "{e:?}");
        let large = StagingCounts {
            direct: 10,
            ..small
        };
        assert!(!model().estimate(&large).staging_pays());
    }

    #[test]
    fn figures_that_make_no_estimate_are_refused() {
        assert!(CostModel::new((1e-6, 0.0), (1e10, 0.0, 0.0)).is_err());
        assert!(CostModel::new((-1.0, 1e9), (1e10, 0.0, 0.0)).is_err());
        assert!(CostModel::new((1e-6, 1e9), (f64::NAN, 0.0, 0.0)).is_err());
        assert!(CostModel::new((1e-6, 1e9), (1e10, 0.0, f64::INFINITY)).is_err());
    }
}
