//! Half-open intervals of logical units (heads, state channels).

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interval {
    pub start: u64,
    pub end: u64,
}

impl Interval {
    pub const fn new(start: u64, end: u64) -> Self {
        Self { start, end }
    }

    pub const fn len(self) -> u64 {
        self.end - self.start
    }

    pub const fn is_empty(self) -> bool {
        self.start >= self.end
    }

    /// The common part of two intervals, `None` when they do not overlap.
    pub fn intersect(self, other: Self) -> Option<Self> {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        (start < end).then_some(Self { start, end })
    }
}

#[cfg(test)]
mod tests {
    use super::Interval;

    #[test]
    fn overlapping_intervals_intersect() {
        let a = Interval::new(0, 4);
        let b = Interval::new(2, 8);
        assert_eq!(a.intersect(b), Some(Interval::new(2, 4)));
        assert_eq!(b.intersect(a), Some(Interval::new(2, 4)));
        assert_eq!(a.intersect(b).map(Interval::len), Some(2));
    }

    #[test]
    fn touching_or_disjoint_intervals_do_not_intersect() {
        assert_eq!(Interval::new(0, 4).intersect(Interval::new(4, 8)), None);
        assert_eq!(Interval::new(0, 1).intersect(Interval::new(5, 8)), None);
        assert!(Interval::new(3, 3).is_empty());
    }

    #[test]
    fn containment_gives_the_inner_interval() {
        assert_eq!(
            Interval::new(0, 16).intersect(Interval::new(4, 6)),
            Some(Interval::new(4, 6))
        );
    }
}
