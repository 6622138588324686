//! Which pipeline stage holds each model layer: stages hold consecutive layers, in order, as
//! many as the layout's `pp_layer_partition` says or, by default, as evenly as possible with the
//! first stages taking one more (5 layers over 2 stages: 3 + 2). vLLM's own default
//! (`VLLM_PP_LAYER_PARTITION` unset) gives the extra layers to the stages before the last
//! instead; `vllm_partition` computes it, to pass as the partition.

use crate::error::{bail, PlanResult};
use crate::layout::ParallelLayout;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stages {
    /// First layer of each stage, ascending; stage `s` holds `starts[s]..starts[s + 1]`.
    starts: Vec<u64>,
    layers: u64,
}

/// As evenly as possible, the first stages taking one more.
pub fn even_partition(layers: u64, pp_size: u64) -> Vec<u64> {
    let (base, extra) = (layers / pp_size, layers % pp_size);
    (0..pp_size).map(|s| base + u64::from(s < extra)).collect()
}

/// vLLM's default partition: as evenly as possible, the extra layers going to the stages just
/// before the last (vLLM's `get_pp_indices`), since the last stage also runs the LM head.
pub fn vllm_partition(layers: u64, pp_size: u64) -> Vec<u64> {
    let (base, extra) = (layers / pp_size, layers % pp_size);
    (0..pp_size)
        .map(|s| base + u64::from(s + 1 < pp_size && s + 1 + extra >= pp_size))
        .collect()
}

impl Stages {
    /// The stages of `layout` over a model of `layers` layers.
    pub fn of(layout: &ParallelLayout, layers: u64) -> PlanResult<Self> {
        let pp = layout.pp_size;
        let partition = if let Some(partition) = &layout.pp_layer_partition {
            let total: u64 = partition.iter().sum();
            if total != layers {
                bail!(
                    "the {} side's pp_layer_partition {partition:?} covers {total} layers, but \
                     the buffers name layers 0..{layers}; give a partition that adds up to \
                     {layers}",
                    layout.role.as_str()
                );
            }
            partition.clone()
        } else {
            if layers < pp {
                bail!(
                    "the {} side has {pp} pipeline stages but the buffers name only {layers} \
                     layers; every stage must hold at least one layer",
                    layout.role.as_str()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Role;

    #[test]
    fn partitions() {
        assert_eq!(even_partition(5, 2), vec![3, 2]);
        assert_eq!(even_partition(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(vllm_partition(10, 4), vec![2, 3, 3, 2]);
        assert_eq!(vllm_partition(5, 2), vec![3, 2]);
        assert_eq!(vllm_partition(8, 4), vec![2; 4]);
    }

    #[test]
    fn layers_map_to_their_stage() {
        let layout = ParallelLayout::with_stages(Role::Prefill, 4, 1, 2, Some(vec![2, 3])).unwrap();
        let stages = Stages::of(&layout, 5).unwrap();
        let of: Vec<u64> = (0..5).map(|l| stages.stage_of(l)).collect();
        assert_eq!(of, vec![0, 0, 1, 1, 1]);
        let err = Stages::of(&layout, 6).unwrap_err();
        assert!(err.message().contains("covers 5 layers"), "{err}");
        let even = ParallelLayout::with_stages(Role::Decode, 8, 1, 4, None).unwrap();
        assert!(Stages::of(&even, 3).is_err());
        let stages = Stages::of(&even, 10).unwrap();
        let of: Vec<u64> = (0..10).map(|l| stages.stage_of(l)).collect();
        assert_eq!(of, vec![0, 0, 0, 1, 1, 1, 2, 2, 3, 3]);
    }
}
