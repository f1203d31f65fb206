//! Timeout statistics: reorder/estimators.py's `SmoothedDelay` (thesis Eq. 3.1-3.10) and `DecayedQuantile` (also
//! the merger's learned wait).
//!
//! Bit-identical to the Python: the same IEEE double operations in the same order, the same libm `log` and `pow`,
//! and Python's mixed int/float arithmetic where it matters (the first sample is kept as an exact integer, as
//! Python keeps it, and converted to a double only where Python converts it).

use std::sync::OnceLock;

/// Exponentially smoothed mean and mean deviation, `value = avg + 2 * dev`.
#[derive(Clone, Debug)]
pub struct SmoothedDelay {
    weight: f64,
    first_dev_abs: bool,
    /// The first sample, exact (Eq. 3.4 / 3.9): Python's `avg` is still that int until the second sample.
    first_us: i128,
    /// The first deviation, exact (Eq. 3.5 / 3.10): Python's `dev` is an int until the third sample.
    first_dev_us: i128,
    avg: f64,
    dev: f64,
    pub count: u64,
}

impl SmoothedDelay {
    /// `weight` must lie in [0, 1] (checked by the config).
    pub fn new(weight: f64, first_dev_abs: bool) -> Self {
        Self {
            weight,
            first_dev_abs,
            first_us: 0,
            first_dev_us: 0,
            avg: 0.0,
            dev: 0.0,
            count: 0,
        }
    }

    pub fn update(&mut self, sample_us: i128) {
        let w = self.weight;
        let sample = to_f64(sample_us);
        match self.count {
            0 => self.first_us = sample_us, // Eq. 3.4 / 3.9
            1 => {
                let first = sample_us - self.first_us; // Eq. 3.5 / 3.10
                self.first_dev_us = if self.first_dev_abs {
                    first.abs()
                } else {
                    first
                };
                self.avg = w * to_f64(self.first_us) + sample * (1.0 - w); // Eq. 3.2 / 3.7
            }
            _ => {
                let dev = if self.count == 2 {
                    to_f64(self.first_dev_us)
                } else {
                    self.dev
                };
                self.dev = w * dev + ((sample - self.avg) * (1.0 - w)).abs(); // Eq. 3.3 / 3.8
                self.avg = w * self.avg + sample * (1.0 - w); // Eq. 3.2 / 3.7
            }
        }
        self.count += 1;
    }

    /// Eq. 3.1 (`t_inter`) or Eq. 3.6 (`t_buffer`); 0 before the first sample.
    pub fn value_us(&self) -> f64 {
        match self.count {
            0 => 0.0,
            1 => to_f64(self.first_us) + 2.0 * 0.0,
            2 => self.avg + 2.0 * to_f64(self.first_dev_us),
            _ => self.avg + 2.0 * self.dev,
        }
    }
}

/// Python's `float(int)`: correctly rounded (an i64 converts without a library call).
#[inline]
pub fn to_f64(x: i128) -> f64 {
    match i64::try_from(x) {
        Ok(v) => v as f64,
        Err(_) => x as f64,
    }
}

const GROWTH: f64 = 1.05;
/// Python's default `max_us` (an hour): the reorderer's gap delays above it share the last bucket.
pub const DEFAULT_MAX_US: i64 = 3_600_000_000;
const RENORMALISE_AT: f64 = 1e200;
const RECOMPUTE_EVERY: u32 = 32;

struct Buckets {
    inv_log_growth: f64,
    /// `ceil(growth ** i)` for every bucket any `max_us` can need: Python computes it per call, the same `pow`
    /// each time.
    upper_edges_us: Vec<i128>,
}

fn buckets() -> &'static Buckets {
    static BUCKETS: OnceLock<Buckets> = OnceLock::new();
    BUCKETS.get_or_init(|| {
        // black_box: computed at run time by libm, as Python does, never folded by the compiler or rewritten.
        let growth = std::hint::black_box(GROWTH);
        let inv_log_growth = 1.0 / growth.ln();
        let upper_edges_us = (0..bucket_count(inv_log_growth, i64::MAX))
            .map(|i| growth.powf(i as f64).ceil() as i128)
            .collect();
        Buckets {
            inv_log_growth,
            upper_edges_us,
        }
    })
}

/// Python's `_n_buckets`: `ceil(log(max_us) / log(growth)) + 2`.
fn bucket_count(inv_log_growth: f64, max_us: i64) -> usize {
    ((std::hint::black_box(max_us) as f64).ln() * inv_log_growth).ceil() as usize + 2
}

/// reorder/estimators.py's `DecayedQuantile`, for the reorderer's gap delays and the merger's silences: a streaming
/// upper quantile of delays with exponential forgetting, in log-spaced buckets (each 5 % wider; the estimate is an
/// upper bucket edge, never below the quantile), each new sample weighing `2 ** (1 / half_life)` times the previous
/// one, the quantile refreshed lazily.
#[derive(Clone, Debug)]
pub struct DecayedQuantile {
    q: f64,
    n_buckets: usize,
    /// Allocated at the first sample: a source that never falls silent costs no bucket array.
    counts: Vec<f64>,
    gain: f64,
    weight: f64,
    total: f64,
    count: u64,
    since: u32,
    dirty: bool,
    cached: i128,
}

impl DecayedQuantile {
    /// `q` in (0, 1), a finite `gain = 2 ** (1 / half_life)` and `max_us` >= 2 are checked by the config.
    pub fn new(q: f64, half_life_samples: f64, max_us: i64) -> Self {
        Self {
            q,
            n_buckets: bucket_count(buckets().inv_log_growth, max_us),
            counts: Vec::new(),
            gain: quantile_gain(half_life_samples),
            weight: 1.0,
            total: 0.0,
            count: 0,
            since: 0,
            dirty: true,
            cached: 0,
        }
    }

    /// Samples added so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn bucket(&self, sample_us: i128) -> usize {
        if sample_us <= 1 {
            return 0;
        }
        let i = (to_f64(sample_us).ln() * buckets().inv_log_growth).ceil();
        // i >= 1 here (ln of a sample above 1 is positive); the cast saturates, the min bounds it.
        (i as usize).min(self.n_buckets - 1)
    }

    pub fn add(&mut self, sample_us: i128) {
        let edges = &buckets().upper_edges_us;
        let i = self.bucket(sample_us);
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
        if (i > 0 && edges[i] > self.cached) || self.since >= RECOMPUTE_EVERY {
            self.dirty = true;
        }
    }

    /// The q-quantile's bucket edge; 0 before any sample.
    pub fn value_us(&mut self) -> i128 {
        if !self.dirty {
            return self.cached;
        }
        self.dirty = false;
        self.since = 0;
        if self.count == 0 {
            self.cached = 0;
            return 0;
        }
        let edges = &buckets().upper_edges_us;
        let allowed_above = (1.0 - self.q) * self.total;
        let mut above = 0.0;
        for i in (0..self.counts.len()).rev() {
            above += self.counts[i];
            if above > allowed_above {
                self.cached = edges[i];
                return self.cached;
            }
        }
        self.cached = edges[0];
        self.cached
    }
}

/// `2.0 ** (1.0 / half_life)`, Python's float power (libm `pow`); not finite when Python would raise.
pub fn quantile_gain(half_life_samples: f64) -> f64 {
    // black_box: LLVM turns pow(2.0, x) into exp2(x), which differs from pow in the last bit for some x (1 in
    // ~6,000 half-lives), and Python calls pow.
    std::hint::black_box(2.0f64).powf(1.0 / half_life_samples)
}

#[cfg(test)]
mod tests {
    use super::{quantile_gain, DecayedQuantile, SmoothedDelay, DEFAULT_MAX_US};

    #[test]
    fn the_gain_is_pythons_pow_not_exp2() {
        // Python: 2.0 ** (1.0 / h); exp2(1 / h) gives 1.0082564257263833. Only `cargo test --release` can tell:
        // a debug build calls pow as written.
        let gain = |h: f64| quantile_gain(std::hint::black_box(h)); // computed at run time, not folded
        assert_eq!(gain(84.29855016349458), 1.008256425726383);
        assert_eq!(gain(2.585163196381966), 1.3075107196105078);
    }

    #[test]
    fn smoothed_delay_eq_3_1_to_3_5_hand_computed() {
        let mut est = SmoothedDelay::new(0.6, false);
        est.update(100);
        assert_eq!(est.value_us(), 100.0);
        est.update(200); // dev = 100, avg = 0.6*100 + 0.4*200 = 140
        assert!((est.value_us() - 340.0).abs() < 1e-9);
        est.update(100); // dev = 0.6*100 + |(100 - 140)*0.4| = 76, avg = 124
        assert!((est.value_us() - (124.0 + 152.0)).abs() < 1e-9);
    }

    #[test]
    fn eq_3_10_takes_the_absolute_value_eq_3_5_does_not() {
        let mut inter = SmoothedDelay::new(0.6, false);
        let mut buf = SmoothedDelay::new(0.6, true);
        for est in [&mut inter, &mut buf] {
            est.update(200);
            est.update(100);
        }
        assert!((inter.value_us() - (160.0 - 200.0)).abs() < 1e-9);
        assert!((buf.value_us() - 360.0).abs() < 1e-9);
    }

    #[test]
    fn decayed_quantile_upper_bucket_edge() {
        let mut q = DecayedQuantile::new(0.98, 1e12, DEFAULT_MAX_US);
        assert_eq!(q.value_us(), 0);
        for _ in 0..99 {
            q.add(100);
        }
        q.add(10_000);
        // ceil(1.05 ** ceil(ln 100 / ln 1.05)) = ceil(1.05 ** 95) = 104
        assert_eq!(q.value_us(), 104);
        q.add(0);
        q.add(-5);
        assert_eq!(q.count(), 102);
    }

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
        q.add(i128::from(i64::MAX));
        // the last bucket: ceil(ln 100 / ln 1.05) + 1 = 96, edge ceil(1.05^96) = 109
        assert_eq!(q.value_us(), 109);
    }

    #[test]
    fn before_any_sample_the_value_is_zero() {
        let mut q = DecayedQuantile::new(0.9, 10.0, 1000);
        assert_eq!((q.count(), q.value_us()), (0, 0));
    }
}
