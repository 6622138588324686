//! Which pipeline stage holds each model layer: stages hold consecutive layers, in order, as
//! many as the layout's `pp_layer_partition` says or, by default, as evenly as possible with the
//! first stages taking one more (5 layers over 2 stages: 3 + 2). vLLM's own default
//! (`VLLM_PP_LAYER_PARTITION` unset) gives the extra layers to the stages before the last
//! instead; `vllm_partition` computes it, to pass as the partition.

use crate::error::{bail, PlanResult};
use crate::layout::{BufferLayout, ParallelLayout};
use crate::limits;

/// Whether a side runs pipeline stages: the one test of it. A one-stage side (even with a
/// one-entry partition) holds every layer on stage 0.
pub const fn is_staged(pp_size: u64) -> bool {
    pp_size > 1
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stages {
    /// First layer of each stage, ascending; stage `s` holds `starts[s]..starts[s + 1]`.
    starts: Vec<u64>,
    layers: u64,
}

/// As evenly as possible, the first stages taking one more: pdplan's default partition.
pub fn even_partition(layers: u64, pp_size: u64) -> Vec<u64> {
    let (base, extra) = (layers / pp_size, layers % pp_size);
    (0..pp_size).map(|s| base + u64::from(s < extra)).collect()
}

/// `even_partition` of a caller's numbers, checked.
pub fn checked_even_partition(layers: u64, pp_size: u64) -> PlanResult<Vec<u64>> {
    check_split(layers, pp_size)?;
    Ok(even_partition(layers, pp_size))
}

fn check_split(layers: u64, pp_size: u64) -> PlanResult<()> {
    limits::STAGES.check("pp_size", pp_size)?;
    if layers < pp_size {
        bail!("cannot split {layers} layers over {pp_size} stages: give at least a layer a stage");
    }
    Ok(())
}

/// vLLM's default partition: as evenly as possible, the extra layers going to the stages just
/// before the last (vLLM's `get_pp_indices`), since the last stage also runs the LM head.
pub fn vllm_partition(layers: u64, pp_size: u64) -> PlanResult<Vec<u64>> {
    check_split(layers, pp_size)?;
    let (base, extra) = (layers / pp_size, layers % pp_size);
    Ok((0..pp_size)
        .map(|s| base + u64::from(s + 1 < pp_size && s + 1 + extra >= pp_size))
        .collect())
}

impl Stages {
    /// The stages of `layout` over a model of `layers` layers.
    pub fn of(layout: &ParallelLayout, layers: u64) -> PlanResult<Self> {
        let pp = layout.pp_size();
        let role = layout.role().as_str();
        let partition = if let Some(partition) = layout.pp_layer_partition() {
            // Each entry is below 2^63 and their sum was checked with the layout.
            let total: u64 = partition.iter().sum();
            // Layers past the last buffer's keep no cache (an MLP layer ends Nemotron-H), so
            // a partition may cover more layers than the buffers name, never fewer.
            if total < layers {
                bail!(
                    "the {role} side's pp_layer_partition {partition:?} covers {total} layers, \
                     but the buffers name layers 0..{layers}; give a partition that adds up to \
                     the model's layer count (at least {layers})"
                );
            }
            partition.to_vec()
        } else {
            if layers < pp {
                bail!(
                    "the {role} side has {pp} pipeline stages but the buffers name only {layers} \
                     layers; every stage must hold at least one layer"
                );
            }
            even_partition(layers, pp)
        };
        let starts = partition
            .iter()
            .scan(0u64, |next, &count| {
                let start = *next;
                *next += count;
                Some(start)
            })
            .collect();
        Ok(Self { starts, layers })
    }

    /// The stage holding `layer` (the last stage for layers past the model's).
    pub fn stage_of(&self, layer: u64) -> u64 {
        let after = self.starts.partition_point(|&start| start <= layer);
        (after.max(1) - 1) as u64
    }

    pub const fn layers(&self) -> u64 {
        self.layers
    }
}

/// Layers the buffers name (one past the largest). Every buffer must name one when either
/// side runs pipeline stages.
pub fn layer_count(
    prefill: &ParallelLayout,
    decode: &ParallelLayout,
    buffers: &[BufferLayout],
) -> PlanResult<u64> {
    let staged = is_staged(prefill.pp_size()) || is_staged(decode.pp_size());
    let mut layers = 0;
    for (position, b) in buffers.iter().enumerate() {
        match b.layer {
            Some(layer) => layers = layers.max(layer + 1),
            None if staged => bail!(
                "buffer {} (position {position}, {}) names no layer, but pipeline stages hold \
                 layers: give every buffer its layer (BufferLayout.layer) when either side has \
                 pp_size > 1",
                b.buffer_index,
                b.buffer_kind.as_str()
            ),
            None => {}
        }
    }
    Ok(layers)
}

/// The stage holding each buffer on one side, given the model's `layers` (`layer_count`): stage
/// 0 everywhere on a side without stages. A one-stage side's partition, when the buffers name
/// layers, must still cover them.
pub fn buffer_stages(
    layout: &ParallelLayout,
    buffers: &[BufferLayout],
    layers: u64,
) -> PlanResult<Vec<u64>> {
    let names_layers = buffers.iter().any(|b| b.layer.is_some());
    if !is_staged(layout.pp_size()) {
        if layout.pp_layer_partition().is_some() && names_layers {
            Stages::of(layout, layers)?;
        }
        return Ok(vec![0; buffers.len()]);
    }
    let stages = Stages::of(layout, layers)?;
    Ok(buffers
        .iter()
        .map(|b| b.layer.map_or(0, |layer| stages.stage_of(layer)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Role;

    #[test]
    fn partitions() {
        assert_eq!(even_partition(5, 2), vec![3, 2]);
        assert_eq!(even_partition(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(vllm_partition(10, 4).unwrap(), vec![2, 3, 3, 2]);
        assert_eq!(vllm_partition(5, 2).unwrap(), vec![3, 2]);
        assert_eq!(vllm_partition(8, 4).unwrap(), vec![2; 4]);
        assert!(vllm_partition(5, 0).is_err() && vllm_partition(3, 4).is_err());
    }

    #[test]
    fn layers_map_to_their_stage() {
        let layout = ParallelLayout::with_stages(Role::Prefill, 4, 1, 2, Some(vec![2, 3])).unwrap();
        let stages = Stages::of(&layout, 5).unwrap();
        let of: Vec<u64> = (0..5).map(|l| stages.stage_of(l)).collect();
        assert_eq!(of, vec![0, 0, 1, 1, 1]);
        let err = Stages::of(&layout, 6).unwrap_err();
        assert!(err.message().contains("covers 5 layers"), "{err}");
        // Trailing layers without a cache: the buffers name fewer layers than the partition.
        let fewer = Stages::of(&layout, 4).unwrap();
        assert_eq!(
            (fewer.stage_of(1), fewer.stage_of(2), fewer.stage_of(3)),
            (0, 1, 1)
        );
        let even = ParallelLayout::with_stages(Role::Decode, 8, 1, 4, None).unwrap();
        assert!(Stages::of(&even, 3).is_err());
        let stages = Stages::of(&even, 10).unwrap();
        let of: Vec<u64> = (0..10).map(|l| stages.stage_of(l)).collect();
        assert_eq!(of, vec![0, 0, 0, 1, 1, 1, 2, 2, 3, 3]);
    }

    #[test]
    fn a_one_stage_partition_is_checked_only_against_named_layers() {
        let one = ParallelLayout::with_stages(Role::Prefill, 2, 1, 1, Some(vec![32])).unwrap();
        let unnamed = BufferLayout {
            layer: None,
            ..crate::layout::tests::buffer()
        };
        assert_eq!(buffer_stages(&one, &[unnamed; 2], 0).unwrap(), vec![0, 0]);
        let named = |layer| BufferLayout {
            layer: Some(layer),
            ..unnamed
        };
        assert_eq!(
            buffer_stages(&one, &[named(0), named(31)], 32).unwrap(),
            vec![0, 0]
        );
        let err = buffer_stages(&one, &[named(0), named(39)], 40).unwrap_err();
        assert!(err.message().contains("covers 32 layers"), "{err}");
        assert!(!is_staged(1) && is_staged(2));
    }
}
