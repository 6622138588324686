//! Layer groups for streaming a request while prefill runs, chosen by the cost model.
//!
//! Prefill finishes its layers one after another, `layer_s` seconds each. Streaming posts a
//! transfer after each group's last layer: posting stalls prefill for `per_transfer_s` (the
//! layer-wise save and its notice sit on prefill's path; `SGLang` measured layer-pipelined
//! transfer slowing 256-token prompts by 18% for this), and the link moves one group at a time,
//! each taking the wire's roofline over its descriptors and bytes (`cost.rs`). The groups
//! chosen, consecutive runs of layers, land the last byte earliest, the fewest among equals.
//! With `k` groups so far prefill's clock after layer `e` is `e * layer_s + k * per_transfer_s`,
//! so the earliest landing of the first `e` layers in `k` groups is
//! `F[e][k] = min over s < e of max(e * layer_s + k * per_transfer_s, F[s][k - 1]) +
//! wire(s..e)`: landing the first groups earlier never delays the rest.

use crate::cost::CostModel;
use crate::error::{bail, PlanResult};

/// The most layers grouped, and the most groups: the choice weighs every run of layers for
/// every count of groups (a model has a few hundred layers at most).
const MAX_GROUPED_LAYERS: u64 = 1024;
const MAX_GROUPS: usize = 64;

/// One layer's share of a request: its descriptors and bytes on the busiest rank pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayerLoad {
    pub descriptors: u64,
    pub bytes: u64,
}

/// The groups chosen, and when the last byte lands after prefill's last layer is done.
#[derive(Debug, Clone, PartialEq)]
pub struct Grouping {
    /// `[start, stop)` layer indexes, in order, covering every layer.
    pub groups: Vec<(u64, u64)>,
    /// Seconds from prefill's end to the last byte landed, streamed in these groups.
    pub tail_s: f64,
    /// The same for the whole request moved after prefill (one group).
    pub whole_tail_s: f64,
}

/// u64 counts as f64: exact below 2^53, and a cost needs no more.
#[allow(clippy::cast_precision_loss, reason = "counts far below 2^53")]
fn real(n: u64) -> f64 {
    n as f64
}

/// The grouping of `loads` (one a layer, in order) that lands the last byte earliest.
pub fn choose(
    loads: &[LayerLoad],
    layer_s: f64,
    per_transfer_s: f64,
    model: &CostModel,
) -> PlanResult<Grouping> {
    for (name, value) in [
        ("layer_seconds", layer_s),
        ("per_transfer_s", per_transfer_s),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            bail!("{name} must be a finite number of seconds, at least 0, got {value}");
        }
    }
    let count = loads.len() as u64;
    if count == 0 || count > MAX_GROUPED_LAYERS {
        bail!(
            "layer groups are chosen for 1 to {MAX_GROUPED_LAYERS} layers (one load a layer), \
             got {count}"
        );
    }
    if !(real(count) * layer_s).is_finite() {
        bail!("layer_seconds={layer_s} over {count} layers is not a finite time");
    }
    let n = loads.len();
    // Prefix sums of descriptors and bytes.
    let mut descriptors = vec![0u64; n + 1];
    let mut bytes = vec![0u64; n + 1];
    for (i, load) in loads.iter().enumerate() {
        descriptors[i + 1] = descriptors[i].saturating_add(load.descriptors);
        bytes[i + 1] = bytes[i].saturating_add(load.bytes);
    }
    let wire =
        |s: usize, e: usize| model.wire_s(descriptors[e] - descriptors[s], bytes[e] - bytes[s]);
    let most = n.min(MAX_GROUPS);
    // landed[k][e]: the earliest the first `e` layers land in `k` groups, and where the last
    // group starts.
    let mut landed = vec![vec![(f64::INFINITY, 0usize); n + 1]; most + 1];
    landed[0][0] = (0.0, 0);
    for k in 1..=most {
        for e in k..=n {
            let clock = real(e as u64) * layer_s + real(k as u64) * per_transfer_s;
            let mut chosen = (f64::INFINITY, 0);
            let previous = &landed[k - 1];
            for (s, &(before, _)) in previous.iter().enumerate().take(e).skip(k - 1) {
                if before.is_finite() {
                    let at = clock.max(before) + wire(s, e);
                    if at < chosen.0 {
                        chosen = (at, s);
                    }
                }
            }
            landed[k][e] = chosen;
        }
    }
    // Fewest groups among equals: a count must land strictly earlier to be chosen.
    let mut count_chosen = 1;
    for k in 2..=most {
        if landed[k][n].0 < landed[count_chosen][n].0 * (1.0 - 1e-12) {
            count_chosen = k;
        }
    }
    let mut groups = Vec::with_capacity(count_chosen);
    let mut e = n;
    for k in (1..=count_chosen).rev() {
        let s = landed[k][e].1;
        groups.push((s as u64, e as u64));
        e = s;
    }
    groups.reverse();
    let compute = real(count) * layer_s;
    Ok(Grouping {
        groups,
        tail_s: landed[count_chosen][n].0 - compute,
        whole_tail_s: landed[1][n].0 - compute,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> CostModel {
        // 1 µs a descriptor, 1 GB/s.
        CostModel::new((1e-6, 1e9), (1e10, 1e-5, 0.0)).unwrap()
    }

    fn loads(n: usize, bytes: u64) -> Vec<LayerLoad> {
        vec![
            LayerLoad {
                descriptors: 1,
                bytes
            };
            n
        ]
    }

    #[test]
    fn short_requests_move_in_one_group_and_long_ones_stream() {
        // 80 layers of 1 KB, 100 µs each: 80 µs on the wire in all, less than one more
        // group's 200 µs stall.
        let short = choose(&loads(80, 1_000), 1e-4, 2e-4, &model()).unwrap();
        assert_eq!(short.groups, vec![(0, 80)]);
        assert!((short.tail_s - short.whole_tail_s).abs() < 1e-12);
        // At a 20 µs stall, moving the first 79 layers while the last computes pays.
        let two = choose(&loads(80, 1_000), 1e-4, 2e-5, &model()).unwrap();
        assert_eq!(two.groups, vec![(0, 79), (79, 80)]);
        assert!(two.tail_s < short.tail_s);
        // 80 layers of 10 MB (10 ms on the wire each) computed in 10 ms each: the link is as
        // fast as prefill, so the more groups the less remains after it (up to the cap).
        let long = choose(&loads(80, 10_000_000), 1e-2, 2e-5, &model()).unwrap();
        assert_eq!(long.groups.len(), MAX_GROUPS);
        assert!(long.tail_s < 0.03 && long.whole_tail_s > 0.8, "{long:?}");
    }

    #[test]
    fn the_groups_cover_every_layer_in_order() {
        let g = choose(&loads(13, 3_000_000), 1e-3, 5e-4, &model()).unwrap();
        assert_eq!(g.groups.first().map(|g| g.0), Some(0));
        assert_eq!(g.groups.last().map(|g| g.1), Some(13));
        for pair in g.groups.windows(2) {
            assert_eq!(pair[0].1, pair[1].0);
        }
        assert!(g.tail_s <= g.whole_tail_s + 1e-12);
        assert!(choose(&[], 1e-3, 0.0, &model()).is_err());
        assert!(choose(&loads(2, 1), f64::NAN, 0.0, &model()).is_err());
    }
}
