//! What the fuzz targets share: reading integers off the input, and the one property every
//! descriptor builder must keep.

use pdplan::descriptors::Descriptors;

/// Reads little-endian integers off the input, zero once it runs out.
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    pub fn int(&mut self, bytes: usize) -> u64 {
        let (head, rest) = self.0.split_at(self.0.len().min(bytes));
        self.0 = rest;
        head.iter()
            .rev()
            .fold(0, |acc, &b| (acc << 8) | u64::from(b))
    }
}

/// Every descriptor lies inside the memory it was given: `[base, base + limit)` of some
/// buffer, on both sides.
pub fn assert_inside(built: &Descriptors, bases: &[u64], limits: &[u64]) {
    for i in 0..built.len() {
        let (s, d, len) = (built.src_addrs[i], built.dst_addrs[i], built.lengths[i]);
        let inside = |addr: u64| {
            bases.iter().zip(limits).any(|(&base, &limit)| {
                addr >= base
                    && (addr - base)
                        .checked_add(len)
                        .is_some_and(|end| end <= limit)
            })
        };
        assert!(inside(s), "src descriptor {i} outside every buffer");
        assert!(inside(d), "dst descriptor {i} outside every buffer");
    }
}
