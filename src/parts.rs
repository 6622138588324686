//! The parts a split axis is made of (Mamba2's conv state `x | B | C`), the groups each part
//! keeps whole, and how a side's TP shards cut them: the one rule of which units a rank holds.

use crate::error::{bail, PlanResult};
use crate::limits::{self, MAX_PARTS, MAX_VALUE};

/// The parts a split axis is made of, each split evenly over the TP shards: a rank holds its
/// shard of part 0, then its shard of part 1, and so on (Mamba2's conv state is `x | B | C`).
/// Empty means one part, the whole axis.
///
/// A part may also name its groups: runs of units a rank keeps whole (Mamba2's B and C are
/// `n_groups` groups of `state_size` channels). A side with more TP shards than a part has
/// groups copies the part's groups: shard `s` of `S` holds group `s * groups / S`, the group
/// its heads read (`vLLM`'s and `SGLang`'s `extra_groups_for_head_shards`). With as many groups
/// or more, the part splits at group boundaries like any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LogicalParts {
    count: usize,
    sizes: [u64; MAX_PARTS],
    /// Each part's groups; all 0 where none were given.
    groups: [u64; MAX_PARTS],
}

/// How one side cuts one part of a split axis: `slices` equal slices of `size` units from
/// unit `start` of the axis, shard `s` of `shards` holding slice `s * slices / shards` (every
/// shard its own slice, or, for a part of fewer groups than shards, a copy of its group's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartCut {
    pub start: u64,
    pub size: u64,
    pub slices: u64,
}

impl PartCut {
    /// Units one slice holds.
    pub const fn slice_len(&self) -> u64 {
        self.size / self.slices
    }

    /// The slice shard `shard` of `shards` holds.
    pub const fn slice_of(&self, shard: u64, shards: u64) -> u64 {
        // Both are at most MAX_WORLD_SIZE (2^20): the product fits.
        shard * self.slices / shards
    }

    /// Whether shards hold copies of this part (fewer slices than shards).
    pub const fn copied(&self, shards: u64) -> bool {
        self.slices < shards
    }

    /// The units `(first of the axis, count)` shard `shard` of `shards` holds of this part.
    pub const fn held(&self, shard: u64, shards: u64) -> (u64, u64) {
        let len = self.slice_len();
        (self.start + self.slice_of(shard, shards) * len, len)
    }
}

impl LogicalParts {
    /// The axis is one part.
    pub const WHOLE: Self = Self {
        count: 0,
        sizes: [0; MAX_PARTS],
        groups: [0; MAX_PARTS],
    };

    pub fn new(sizes: &[u64]) -> PlanResult<Self> {
        limits::PARTS.check("len(logical_parts)", sizes.len() as u64)?;
        let mut parts = Self::WHOLE;
        for (slot, &size) in parts.sizes.iter_mut().zip(sizes) {
            if size == 0 || size > MAX_VALUE {
                bail!("logical_parts sizes must be positive and below 2^63, got {sizes:?}");
            }
            *slot = size;
        }
        parts.count = sizes.len();
        Ok(parts)
    }

    /// These parts with each part's groups (`logical_part_groups`): one count a part, each
    /// dividing its part's size.
    pub fn with_groups(mut self, groups: &[u64]) -> PlanResult<Self> {
        if groups.len() != self.count {
            bail!(
                "logical_part_groups has {} counts for {} logical_parts; give one group count \
                 a part (its own size where it has no groups)",
                groups.len(),
                self.count
            );
        }
        for ((slot, &count), &size) in self.groups.iter_mut().zip(groups).zip(&self.sizes) {
            if count == 0 || size % count != 0 {
                bail!(
                    "logical_part_groups {groups:?}: each part's group count must be positive \
                     and divide the part's size ({:?})",
                    self.given()
                );
            }
            *slot = count;
        }
        Ok(self)
    }

    /// The sizes as given (empty for a whole axis).
    pub fn given(&self) -> &[u64] {
        self.sizes.get(..self.count).unwrap_or(&[])
    }

    /// Each part's groups as given (empty where none were).
    pub fn groups(&self) -> &[u64] {
        if self.groups.first().copied().unwrap_or(0) == 0 {
            return &[];
        }
        self.groups.get(..self.count).unwrap_or(&[])
    }

    /// The part sizes of an axis of `logical_size` units: the given ones, or the whole axis.
    pub fn sizes(&self, logical_size: u64) -> impl Iterator<Item = u64> + '_ {
        let whole = (self.count == 0).then_some(logical_size);
        self.given().iter().copied().chain(whole)
    }

    /// How a side of `shards` TP shards cuts each part of an axis of `logical_size` units:
    /// into `shards` slices, or into its groups where it has fewer (each then copied onto
    /// `shards / groups` shards). `check_cuts` says whether the cuts are whole.
    pub fn cuts(&self, logical_size: u64, shards: u64) -> impl Iterator<Item = PartCut> + '_ {
        let groups = self.groups();
        let mut start = 0;
        self.sizes(logical_size).enumerate().map(move |(i, size)| {
            let slices = match groups.get(i) {
                Some(&g) if g < shards => g,
                _ => shards,
            };
            let cut = PartCut {
                start,
                size,
                slices,
            };
            start += size;
            cut
        })
    }

    /// Units one shard of `shards` holds: its slice of every part.
    pub fn shard_units(&self, logical_size: u64, shards: u64) -> u64 {
        self.cuts(logical_size, shards).map(|c| c.slice_len()).sum()
    }

    /// Why `shards` TP shards cannot cut these parts whole, if they cannot: each part must
    /// split evenly, and a part with groups must have a multiple or a divisor of `shards`
    /// (a group is never split, and copies are dealt evenly).
    pub fn check_cuts(&self, logical_size: u64, shards: u64) -> Result<(), String> {
        let groups = self.groups();
        for (i, cut) in self.cuts(logical_size, shards).enumerate() {
            if let Some(&g) = groups.get(i) {
                if g % shards != 0 && shards % g != 0 {
                    return Err(format!(
                        "a logical part of {} units in {g} groups cannot be dealt to \
                         effective_tp_size={shards} shards: its groups must be a multiple or a \
                         divisor of the shard count",
                        cut.size
                    ));
                }
            }
            if cut.size % cut.slices != 0 {
                let what = if self.count == 0 {
                    "logical_size"
                } else {
                    "a logical part of"
                };
                return Err(format!(
                    "{what}={} is not divisible by effective_tp_size={shards}",
                    cut.size
                ));
            }
        }
        Ok(())
    }
}
