//! `reorder.estimators.DecayedQuantile`, the same floating-point operations in the same order: the learned merge
//! wait must come out to the same microsecond as the Python core's (the differential tests compare deadlines).
//! `ln` and `powf` go to the platform's libm, as Python's `math.log` and float `**` do.

/// Streaming upper quantile of positive delays with exponential forgetting and bounded memory (log-spaced buckets,
/// each `growth` times wider than the previous; the estimate is an upper bucket edge, never below the quantile).
#[derive(Debug, Clone)]
pub struct DecayedQuantile {
    q: f64,
    growth: f64,
    inv_log_growth: f64,
    n_buckets: usize,
    /// Allocated at the first sample: a source that never falls silent costs no bucket array.
    counts: Vec<f64>,
    gain: f64,
    weight: f64,
    total: f64,
    count: u64,
    recompute_every: u32,
    since: u32,
    dirty: bool,
    cached: i64,
}

const RENORMALISE_AT: f64 = 1e200;
/// Python's default `growth`: a bucket edge is at most 5 % above the true quantile.
pub const DEFAULT_GROWTH: f64 = 1.05;
const RECOMPUTE_EVERY: u32 = 32;

impl DecayedQuantile {
    /// `q` in (0, 1), `half_life_samples` > 0 and finite, `max_us` >= 2 (the caller validates: MergerConfig).
    pub fn new(q: f64, half_life_samples: f64, max_us: i64) -> Self {
        // black_box: computed at run time by libm, as Python does, never folded by the compiler or rewritten
        // (LLVM turns pow(2.0, x) into exp2(x), which may round differently in the last bit).
        let growth = std::hint::black_box(DEFAULT_GROWTH);
        let inv_log_growth = 1.0 / growth.ln();
        let n_buckets = ((max_us as f64).ln() * inv_log_growth).ceil() as usize + 2;
        DecayedQuantile {
            q,
            growth,
            inv_log_growth,
            n_buckets,
            counts: Vec::new(),
            gain: std::hint::black_box(2.0_f64).powf(1.0 / half_life_samples),
            weight: 1.0,
            total: 0.0,
            count: 0,
            recompute_every: RECOMPUTE_EVERY,
            since: 0,
            dirty: true,
            cached: 0,
        }
    }

    /// Samples added so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn bucket(&self, sample_us: f64) -> usize {
        if sample_us <= 1.0 {
            return 0;
        }
        let i = (sample_us.ln() * self.inv_log_growth).ceil();
        // i >= 1 here (ln of a sample above 1 is positive); the cast saturates, the min bounds it.
        (i as usize).min(self.n_buckets - 1)
    }

    fn upper_edge_us(&self, bucket: usize) -> i64 {
        self.growth.powf(bucket as f64).ceil() as i64
    }

    pub fn add(&mut self, sample_us: i64) {
        let i = self.bucket(sample_us as f64);
        if self.counts.is_empty() {
            self.counts = vec![0.0; self.n_buckets];
        }
        self.counts[i] += self.weight;
        self.total += self.weight;
        self.weight *= self.gain;
        if self.weight > RENORMALISE_AT {
            let scale = 1.0 / self.weight;
            for c in &mut self.counts {
                *c *= scale;
            }
            self.total *= scale;
            self.weight = 1.0;
        }
        self.count += 1;
        self.since += 1;
        // A sample above the cached quantile can only raise it: refresh at once, otherwise lazily.
        if (i > 0 && self.upper_edge_us(i) > self.cached) || self.since >= self.recompute_every {
            self.dirty = true;
        }
    }

    /// The q-quantile's bucket edge; 0 before any sample.
    pub fn value_us(&mut self) -> i64 {
        if !self.dirty {
            return self.cached;
        }
        self.dirty = false;
        self.since = 0;
        if self.count == 0 {
            self.cached = 0;
            return 0;
        }
        let allowed_above = (1.0 - self.q) * self.total;
        let mut above = 0.0;
        for i in (0..self.counts.len()).rev() {
            above += self.counts[i];
            if above > allowed_above {
                self.cached = self.upper_edge_us(i);
                return self.cached;
            }
        }
        self.cached = self.upper_edge_us(0);
        self.cached
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_30_us_sample_falls_in_the_bucket_whose_edge_is_31_us() {
        // ceil(ln 30 / ln 1.05) = 70; ceil(1.05^70) = 31 (the Python test's hand-computed figure)
        let mut q = DecayedQuantile::new(0.9999, 10_000.0, 5_000);
        for _ in 0..3 {
            q.add(30);
        }
        assert_eq!(q.value_us(), 31);
        q.add(500); // above the cached edge: refreshed at once
        assert_eq!(q.value_us(), 516);
    }

    #[test]
    fn samples_at_or_below_one_us_and_beyond_the_top_land_in_the_end_buckets() {
        let mut q = DecayedQuantile::new(0.5, 10_000.0, 2);
        q.add(-5);
        assert_eq!(q.value_us(), 1);
        let mut q = DecayedQuantile::new(0.5, 10_000.0, 100);
        q.add(i64::MAX);
        // the last bucket: ceil(ln 100 / ln 1.05) + 1 = 96, edge ceil(1.05^96) = 109
        assert_eq!(q.value_us(), 109);
    }

    #[test]
    fn before_any_sample_the_value_is_zero() {
        let mut q = DecayedQuantile::new(0.9, 10.0, 1000);
        assert_eq!((q.count(), q.value_us()), (0, 0));
    }
}
