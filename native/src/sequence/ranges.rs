//! Sets of integers kept as sorted, disjoint, inclusive ranges, each range carrying a value: reorder/ranges.py's
//! `RangeMap`, the methods the sequence reorderer uses, with the same merging of adjacent equal values (which ranges
//! exist decides which skipped seqs `drop_first_ranges` forgets, so it must match exactly).

/// Integers `lo..=hi` mapped to values, one entry per run of consecutive integers with one value.
#[derive(Clone, Debug, Default)]
pub struct RangeMap<V> {
    los: Vec<i128>,
    his: Vec<i128>,
    vals: Vec<V>,
    /// Integers covered (the Python `count`).
    count: i128,
}

impl<V: Clone + PartialEq> RangeMap<V> {
    pub fn new() -> Self {
        Self {
            los: Vec::new(),
            his: Vec::new(),
            vals: Vec::new(),
            count: 0,
        }
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.los.len()
    }

    pub fn is_empty(&self) -> bool {
        self.los.is_empty()
    }

    /// Number of integers covered.
    pub fn count(&self) -> i128 {
        self.count
    }

    /// The ranges, lowest first, as `(lo, hi, value)`.
    pub fn iter(&self) -> impl Iterator<Item = (i128, i128, &V)> + '_ {
        self.los
            .iter()
            .zip(&self.his)
            .zip(&self.vals)
            .map(|((&lo, &hi), v)| (lo, hi, v))
    }

    fn bisect_right(&self, x: i128) -> usize {
        self.los.partition_point(|&lo| lo <= x)
    }

    pub fn get(&self, x: i128) -> Option<&V> {
        let i = self.bisect_right(x);
        if i > 0 && self.his[i - 1] >= x {
            Some(&self.vals[i - 1])
        } else {
            None
        }
    }

    /// Map every integer of `lo..=hi` to `value` (replacing what was there); nothing when `lo > hi`.
    pub fn add(&mut self, lo: i128, hi: i128, value: V) {
        if lo > hi {
            return;
        }
        let last_hi = self.his.last().copied();
        if last_hi.map_or(true, |h| lo > h) {
            // the usual case: above everything held
            let n = self.los.len();
            if n > 0 && Some(lo - 1) == last_hi && self.vals[n - 1] == value {
                self.his[n - 1] = hi;
            } else {
                self.los.push(lo);
                self.his.push(hi);
                self.vals.push(value);
            }
            self.count += hi - lo + 1;
            return;
        }
        self.pop_range(lo, hi);
        let mut i = self.bisect_right(lo); // insert before index i
        if i > 0 && self.his[i - 1] == lo - 1 && self.vals[i - 1] == value {
            i -= 1;
            self.his[i] = hi;
        } else {
            self.los.insert(i, lo);
            self.his.insert(i, hi);
            self.vals.insert(i, value.clone());
        }
        if i + 1 < self.los.len() && self.los[i + 1] == hi + 1 && self.vals[i + 1] == value {
            self.his[i] = self.his[i + 1];
            self.los.remove(i + 1);
            self.his.remove(i + 1);
            self.vals.remove(i + 1);
        }
        self.count += hi - lo + 1;
    }

    /// Remove `x`; its value, or None when it was not held (splits its range in two when inside it).
    pub fn pop(&mut self, x: i128) -> Option<V> {
        let i = self.bisect_right(x);
        if i == 0 || self.his[i - 1] < x {
            return None;
        }
        let i = i - 1;
        let value = self.vals[i].clone();
        let (lo, hi) = (self.los[i], self.his[i]);
        if lo == hi {
            self.los.remove(i);
            self.his.remove(i);
            self.vals.remove(i);
        } else if x == lo {
            self.los[i] = x + 1;
        } else if x == hi {
            self.his[i] = x - 1;
        } else {
            self.his[i] = x - 1;
            self.los.insert(i + 1, x + 1);
            self.his.insert(i + 1, hi);
            self.vals.insert(i + 1, value.clone());
        }
        self.count -= 1;
        Some(value)
    }

    /// Remove every integer of `lo..=hi`; the removed pieces `(lo, hi, value)`, lowest first.
    pub fn pop_range(&mut self, lo: i128, hi: i128) -> Vec<(i128, i128, V)> {
        let n = self.los.len();
        if lo > hi || n == 0 || hi < self.los[0] || lo > self.his[n - 1] {
            return Vec::new();
        }
        let mut i = self.bisect_right(lo);
        // bisect_right - 1, stepped over when that range ends below lo
        if i > 0 && self.his[i - 1] >= lo {
            i -= 1;
        }
        let mut j = i;
        let mut removed = Vec::new();
        let mut keep: Vec<(i128, i128, V)> = Vec::new();
        while j < n && self.los[j] <= hi {
            let (r_lo, r_hi) = (self.los[j], self.his[j]);
            let r_val = &self.vals[j];
            if r_lo < lo {
                keep.push((r_lo, lo - 1, r_val.clone()));
            }
            let (cut_lo, cut_hi) = (lo.max(r_lo), hi.min(r_hi));
            removed.push((cut_lo, cut_hi, r_val.clone()));
            self.count -= cut_hi - cut_lo + 1;
            if r_hi > hi {
                keep.push((hi + 1, r_hi, r_val.clone()));
            }
            j += 1;
        }
        self.los.splice(i..j, keep.iter().map(|k| k.0));
        self.his.splice(i..j, keep.iter().map(|k| k.1));
        self.vals.splice(i..j, keep.into_iter().map(|k| k.2));
        removed
    }

    /// Drop the lowest integers until at most `max_count` are held; how many were dropped.
    pub fn trim_low(&mut self, max_count: i128) -> i128 {
        let excess = self.count - max_count;
        if excess <= 0 {
            return 0;
        }
        // Python raises IndexError when asked to drop more than it holds (max_count < 0): the config refuses that.
        let excess = excess.min(self.count);
        let mut dropped = 0;
        let mut whole = 0;
        while dropped < excess {
            let size = self.his[whole] - self.los[whole] + 1;
            if dropped + size <= excess {
                dropped += size;
                whole += 1;
            } else {
                self.los[whole] += excess - dropped;
                dropped = excess;
            }
        }
        if whole > 0 {
            self.los.drain(..whole);
            self.his.drain(..whole);
            self.vals.drain(..whole);
        }
        self.count -= dropped;
        dropped
    }

    /// Drop the lowest ranges until at most `max_ranges` are held; how many integers were dropped.
    pub fn drop_first_ranges(&mut self, max_ranges: usize) -> i128 {
        let n = self.los.len();
        if n <= max_ranges {
            return 0;
        }
        let excess = n - max_ranges;
        let dropped: i128 = (0..excess).map(|k| self.his[k] - self.los[k] + 1).sum();
        self.los.drain(..excess);
        self.his.drain(..excess);
        self.vals.drain(..excess);
        self.count -= dropped;
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::RangeMap;

    /// A map given `(lo, hi, value)` by `add`, in that order.
    fn added(adds: &[(i128, i128, i32)]) -> RangeMap<i32> {
        let mut m = RangeMap::new();
        for &(lo, hi, value) in adds {
            m.add(lo, hi, value);
        }
        m
    }

    fn ranges(m: &RangeMap<i32>) -> Vec<(i128, i128, i32)> {
        m.iter().map(|(lo, hi, v)| (lo, hi, *v)).collect()
    }

    #[test]
    fn add_merges_adjacent_equal_values_only() {
        let m = added(&[(1, 3, 7), (4, 5, 7), (6, 6, 8), (10, 9, 1)]); // (10, 9): empty
        assert_eq!(ranges(&m), vec![(1, 5, 7), (6, 6, 8)]);
        assert_eq!(m.count(), 6);
        // an insert below that closes a hole between two equal values merges all three
        let m = added(&[(1, 2, 1), (5, 6, 1), (3, 4, 1)]);
        assert_eq!(ranges(&m), vec![(1, 6, 1)]);
        assert_eq!(m.count(), 6);
    }

    #[test]
    fn add_replaces_what_it_overlaps() {
        let m = added(&[(1, 10, 1), (4, 6, 2)]);
        assert_eq!(ranges(&m), vec![(1, 3, 1), (4, 6, 2), (7, 10, 1)]);
        assert_eq!(m.count(), 10);
    }

    #[test]
    fn pop_splits_a_range() {
        let mut m = added(&[(1, 5, 3)]);
        assert_eq!(m.pop(3), Some(3));
        assert_eq!(m.pop(3), None);
        assert_eq!(m.pop(1), Some(3));
        assert_eq!(m.pop(5), Some(3));
        assert_eq!(ranges(&m), vec![(2, 2, 3), (4, 4, 3)]);
        assert_eq!(m.pop(2), Some(3));
        assert_eq!(ranges(&m), vec![(4, 4, 3)]);
        assert_eq!(m.count(), 1);
    }

    #[test]
    fn pop_range_returns_the_pieces_and_keeps_the_rest() {
        let mut m = added(&[(1, 3, 1), (5, 8, 2), (10, 12, 3)]);
        assert_eq!(m.pop_range(2, 10), vec![(2, 3, 1), (5, 8, 2), (10, 10, 3)]);
        assert_eq!(ranges(&m), vec![(1, 1, 1), (11, 12, 3)]);
        assert_eq!(m.count(), 3);
        assert!(m.pop_range(2, 10).is_empty());
        assert!(m.pop_range(20, 30).is_empty());
    }

    #[test]
    fn trim_low_and_drop_first_ranges() {
        let mut m = added(&[(1, 3, 1), (5, 8, 2)]);
        assert_eq!(m.trim_low(5), 2);
        assert_eq!(ranges(&m), vec![(3, 3, 1), (5, 8, 2)]);
        assert_eq!(m.trim_low(10), 0);
        assert_eq!(m.drop_first_ranges(1), 1);
        assert_eq!(ranges(&m), vec![(5, 8, 2)]);
        assert_eq!(m.trim_low(0), 4);
        assert!(m.is_empty());
        assert_eq!(m.get(5), None);
    }
}
