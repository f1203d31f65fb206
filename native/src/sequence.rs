//! Per-(source, stream) sequence reorderer: the compiled twin of reorder/sequence.py's `SequenceReorderer` (thesis
//! section 3.2.1 and Figure 4.2, plus the adaptive gap-quantile mode), its executable specification.
//!
//! Sans-IO: the caller passes the current (virtual or real) time to every call and asks `next_deadline_us` when to
//! call `advance` next. Payloads are opaque: the reorderer carries a `P` (an index, a handle) for each event and hands
//! it back in its outputs. Integers are `i128` inside so that no sum of two inputs (seqs up to the contract's
//! `2**63 - 1`, times, durations) can overflow: Python's ints do not either. `py` holds the Python class that the
//! differential tests (tests/unit/native/test_native_sequence.py) drive side by side with the Python core.

pub mod estimators;
pub mod py;
pub mod ranges;
pub(crate) mod run;

use std::collections::BTreeMap;
use std::fmt;

use estimators::{quantile_gain, to_f64, DecayedQuantile, SmoothedDelay, DEFAULT_MAX_US};
use ranges::RangeMap;

pub type Seq = i128;
pub type Micros = i128;

/// Early events one reorderer may hold (reorder/sequence.py's `DEFAULT_MAX_BUFFERED`).
pub const DEFAULT_MAX_BUFFERED: i128 = 1_000_000;
/// Skipped seqs remembered to tell a late arrival from a duplicate (`DEFAULT_MAX_SKIPPED_TRACKED`) ...
pub const DEFAULT_MAX_SKIPPED_TRACKED: i128 = 100_000;
/// ... in at most this many ranges, the lowest dropped first (`MAX_SKIPPED_RANGES`).
pub const MAX_SKIPPED_RANGES: usize = 1024;
/// Gap samples before the adaptive quantile is trusted at all (`DEFAULT_MIN_GAP_SAMPLES`).
pub const DEFAULT_MIN_GAP_SAMPLES: i128 = 200;
/// The warm-up floor of a gap's wait until the quantile rests on `1 / (1 - q)` samples.
pub const DEFAULT_WARMUP_MIN_TIMEOUT_US: i128 = 100_000;
/// Adaptive mode: how far the latency threshold may learn (`DEFAULT_MAX_LATENCY_THRESHOLD_US`).
pub const DEFAULT_MAX_LATENCY_THRESHOLD_US: i128 = 60_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The `target_accuracy`-quantile of gap-closing delays.
    Adaptive,
    /// Eq. 3.11: `min(t_latency_th, max(t_inter, t_buffer))`.
    Thesis,
}

/// reorder/sequence.py's `SequenceConfig`, field for field.
#[derive(Clone, Debug, PartialEq)]
pub struct SequenceConfig {
    pub mode: Mode,
    pub latency_threshold_us: i128,
    pub alpha: f64,
    pub beta: f64,
    pub drop_late: bool,
    pub target_accuracy: f64,
    pub timeout_factor: f64,
    pub quantile_half_life: f64,
    pub max_latency_threshold_us: i128,
    pub min_gap_samples: i128,
    pub warmup_samples: Option<i128>,
    pub warmup_min_timeout_us: i128,
    pub min_timeout_us: i128,
    pub initial_seq: Option<i128>,
    pub max_buffered: i128,
    pub max_skipped_tracked: i128,
}

impl Default for SequenceConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Adaptive,
            latency_threshold_us: 2_000_000,
            alpha: 0.6,
            beta: 0.6,
            drop_late: false,
            target_accuracy: 0.9999,
            timeout_factor: 2.0,
            quantile_half_life: 10_000.0,
            max_latency_threshold_us: DEFAULT_MAX_LATENCY_THRESHOLD_US,
            min_gap_samples: DEFAULT_MIN_GAP_SAMPLES,
            warmup_samples: None,
            warmup_min_timeout_us: DEFAULT_WARMUP_MIN_TIMEOUT_US,
            min_timeout_us: 0,
            initial_seq: Some(0),
            max_buffered: DEFAULT_MAX_BUFFERED,
            max_skipped_tracked: DEFAULT_MAX_SKIPPED_TRACKED,
        }
    }
}

/// Why a config is refused: the Python config's own checks, plus the values with which the Python core would raise
/// later, mid-stream (a zero or tiny half-life, a non-finite timeout factor, a negative skipped-seq limit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The bound of every integer the reorderer takes in (seqs, times, durations): sums of a few such never overflow.
pub const INPUT_BOUND: i128 = 1 << 64;

impl SequenceConfig {
    /// Query 5.3 of the thesis: `reorder:sequence(..., 500L, 0.6, 0.6, false)`.
    pub fn thesis(latency_threshold_us: i128) -> Self {
        Self {
            mode: Mode::Thesis,
            latency_threshold_us,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: &str| Err(ConfigError(m.to_owned()));
        if self.latency_threshold_us < 0 {
            return err("latency_threshold_us must be >= 0");
        }
        if !(self.target_accuracy > 0.0 && self.target_accuracy < 1.0) {
            return err("target_accuracy must be in (0, 1)");
        }
        if self.max_buffered < 1 {
            return err("max_buffered must be >= 1");
        }
        if self.min_timeout_us < 0 {
            return err("min_timeout_us must be >= 0");
        }
        if self.warmup_min_timeout_us < 0 {
            return err("warmup_min_timeout_us must be >= 0");
        }
        if self.max_latency_threshold_us < 0 {
            return err("max_latency_threshold_us must be >= 0");
        }
        if !(0.0..=1.0).contains(&self.alpha) || !(0.0..=1.0).contains(&self.beta) {
            return err("smoothing factor must be in [0, 1]");
        }
        if self.max_skipped_tracked < 0 {
            return err("max_skipped_tracked must be >= 0");
        }
        if self.quantile_half_life == 0.0 || !quantile_gain(self.quantile_half_life).is_finite() {
            return err(
                "quantile_half_life must be nonzero and 2 ** (1 / quantile_half_life) finite",
            );
        }
        // The learned wait is timeout_factor times a bucket edge (at most 4e9), the learned cap timeout_factor times
        // the longest gap delay (at most 2**65): both must stay finite numbers.
        if !self.timeout_factor.is_finite() || self.timeout_factor.abs() > 1e290 {
            return err("timeout_factor must be finite (|timeout_factor| <= 1e290)");
        }
        let ints = [
            self.latency_threshold_us,
            self.max_latency_threshold_us,
            self.min_gap_samples,
            self.warmup_samples.unwrap_or(0),
            self.warmup_min_timeout_us,
            self.min_timeout_us,
            self.initial_seq.unwrap_or(0),
            self.max_buffered,
            self.max_skipped_tracked,
        ];
        if ints.iter().any(|v| v.abs() > INPUT_BOUND) {
            return err("integer settings must lie within -2**64..2**64");
        }
        Ok(())
    }

    /// `warmup_samples`, or the default its `target_accuracy` implies.
    pub fn effective_warmup_samples(&self) -> i128 {
        self.warmup_samples
            .unwrap_or_else(|| warmup_samples_for(self.target_accuracy))
    }
}

/// Gap samples the `target_accuracy`-quantile needs before its learned wait is trusted below the warm-up floor:
/// `max(1, ceil(round(1 / (1 - q), 6)))`, Python's decimal `round` reproduced by a correctly rounded format.
pub fn warmup_samples_for(target_accuracy: f64) -> i128 {
    let x = 1.0 / (1.0 - target_accuracy);
    let rounded: f64 = format!("{x:.6}").parse().unwrap_or(x);
    (rounded.ceil() as i128).max(1)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateReason {
    LateAfterSkip,
    BeforeStart,
    Duplicate,
}

impl LateReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LateAfterSkip => "late_after_skip",
            Self::BeforeStart => "before_start",
            Self::Duplicate => "duplicate",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GapReason {
    Timeout,
    BufferFull,
}

impl GapReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::BufferFull => "buffer_full",
        }
    }
}

/// What a call releases or reports: reorder/records.py's `Released`, `Late` and `GapSkipped`, with the event as its
/// payload handle and seq (`GapSkipped` without source and stream, which the caller knows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output<P> {
    Released {
        payload: P,
        seq: Seq,
        arrival_us: Micros,
        release_us: Micros,
        late: bool,
    },
    Late {
        payload: P,
        seq: Seq,
        arrival_us: Micros,
        reason: LateReason,
        lateness_us: Micros,
        passed: bool,
    },
    GapSkipped {
        first_seq: Seq,
        last_seq: Seq,
        waited_us: Micros,
        at_us: Micros,
        reason: GapReason,
    },
}

impl<P> Output<P> {
    /// Python's `Released(event, now_us, now_us, late=...)`: released the moment it arrived.
    fn released_on_arrival(payload: P, seq: Seq, now_us: Micros, late: bool) -> Self {
        Self::Released {
            payload,
            seq,
            arrival_us: now_us,
            release_us: now_us,
            late,
        }
    }

    pub fn payload(&self) -> Option<&P> {
        match self {
            Self::Released { payload, .. } | Self::Late { payload, .. } => Some(payload),
            Self::GapSkipped { .. } => None,
        }
    }
}

/// reorder/sequence.py's `SequenceCounters`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SequenceCounters {
    pub released: u64,
    pub in_order: u64,
    pub buffered: u64,
    pub peak_buffered: u64,
    pub gaps_closed: u64,
    pub timeouts: u64,
    pub buffer_full_skips: u64,
    pub skipped_seqs: i128,
    pub late: u64,
    pub late_passed: u64,
    pub duplicates: u64,
}

/// Releases one source's events of one stream in sequence order (thesis Figure 4.2).
#[derive(Clone, Debug)]
pub struct SequenceReorderer<P> {
    config: SequenceConfig,
    warmup_samples: i128,
    pub counters: SequenceCounters,
    inter_arrival: SmoothedDelay,
    buffer_delay: SmoothedDelay,
    gap_delay: DecayedQuantile,
    adopt_first: bool,
    expected: Seq,
    max_seen: Seq,
    first_seq: Seq,
    /// Early events by seq, with their arrival time; the lowest key is the Python heap's head.
    buffer: BTreeMap<Seq, (P, Micros)>,
    /// seq -> time the hole became visible, per run of seqs.
    holes: RangeMap<Micros>,
    /// skipped seq -> (time its hole became visible, time it was skipped), per run.
    skipped: RangeMap<(Micros, Micros)>,
    last_in_order_us: Option<Micros>,
    /// The longest gap-closing delay seen (0 before any): the learned cap's evidence.
    longest_gap_delay_us: Micros,
    deadline_us: Option<Micros>,
    head_since_us: Micros,
}

impl<P: Clone> SequenceReorderer<P> {
    pub fn new(config: SequenceConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let adopt_first = config.initial_seq.is_none();
        // with initial_seq None, expected starts below any real seq and the first event is adopted
        let expected = config.initial_seq.unwrap_or(-(1 << 62));
        Ok(Self {
            warmup_samples: config.effective_warmup_samples(),
            counters: SequenceCounters::default(),
            inter_arrival: SmoothedDelay::new(config.alpha, false), // Eq. 3.1-3.5
            buffer_delay: SmoothedDelay::new(config.beta, true),    // Eq. 3.6-3.10
            gap_delay: DecayedQuantile::new(
                config.target_accuracy,
                config.quantile_half_life,
                DEFAULT_MAX_US,
            ),
            adopt_first,
            expected,
            max_seen: expected - 1,
            first_seq: expected,
            buffer: BTreeMap::new(),
            holes: RangeMap::new(),
            skipped: RangeMap::new(),
            last_in_order_us: None,
            longest_gap_delay_us: 0,
            deadline_us: None,
            head_since_us: 0,
            config,
        })
    }

    pub fn config(&self) -> &SequenceConfig {
        &self.config
    }

    /// The next sequence number this reorderer will release (Figure 4.2's expSeqNum).
    pub fn expected_seq(&self) -> Seq {
        self.expected
    }

    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// When the head gap times out, or None when nothing is held.
    pub fn next_deadline_us(&self) -> Option<Micros> {
        self.deadline_us
    }

    /// Skipped seqs remembered, and in how many ranges (memory per source: bounded by the config and 1,024).
    pub fn skipped_tracked(&self) -> (i128, usize) {
        (self.skipped.count(), self.skipped.len())
    }

    /// Holes tracked (seqs, ranges).
    pub fn holes_tracked(&self) -> (i128, usize) {
        (self.holes.count(), self.holes.len())
    }

    /// The longest gap-closing delay seen so far (0 before any).
    pub fn longest_gap_delay_us(&self) -> Micros {
        self.longest_gap_delay_us
    }

    /// The cap of the wait for a gap opening now. Thesis mode: `latency_threshold_us`. Adaptive mode:
    /// `max(latency_threshold_us, min(max_latency_threshold_us, timeout_factor x longest_gap_delay_us))`.
    pub fn effective_latency_threshold_us(&self) -> Micros {
        let cfg = &self.config;
        if cfg.mode == Mode::Thesis {
            return cfg.latency_threshold_us;
        }
        // A gap that closed after D proves this source's gaps can take D: the cap only bounds the quantile's wait
        // and never shrinks (MP-K-slack's K).
        let learned = (cfg.timeout_factor * to_f64(self.longest_gap_delay_us)).trunc() as i128;
        cfg.latency_threshold_us
            .max(cfg.max_latency_threshold_us.min(learned))
    }

    /// The timeout a gap opening now would get (Eq. 3.11, or the adaptive quantile).
    pub fn timeout_us(&mut self) -> Micros {
        let cfg = &self.config;
        if cfg.mode == Mode::Thesis {
            let t_inter = self.inter_arrival.value_us();
            let t_buffer = self.buffer_delay.value_us();
            let m = py_max3(t_inter, t_buffer, 0.0);
            // Python's min(int, float) compares exactly: m < T exactly when floor(m) < T (T an integer, m >= 0).
            let floor_m = m.floor();
            return if floor_m < 1.7e38 && (floor_m as i128) < cfg.latency_threshold_us {
                floor_m as i128
            } else {
                cfg.latency_threshold_us
            };
        }
        let cap_us = self.effective_latency_threshold_us();
        let cfg = &self.config;
        let samples = i128::from(self.gap_delay.count());
        if samples < cfg.min_gap_samples {
            return cap_us;
        }
        let factor = cfg.timeout_factor;
        let (min_timeout_us, warmup_floor_us) = (cfg.min_timeout_us, cfg.warmup_min_timeout_us);
        let learned = factor * to_f64(self.gap_delay.value_us());
        let mut learned_us = min_timeout_us.max(learned.trunc() as i128);
        if samples < self.warmup_samples {
            learned_us = learned_us.max(warmup_floor_us);
        }
        cap_us.min(learned_us)
    }

    /// How long a merger should wait for this source's next release (thesis section 3.2.2).
    pub fn merge_wait_us(&mut self, now_us: Micros) -> Micros {
        if self.config.mode == Mode::Thesis {
            return self.timeout_us();
        }
        let hold = self.deadline_us.map_or(0, |d| (d - now_us).max(0));
        hold + self.timeout_us() + (self.inter_arrival.value_us().trunc() as i128).max(0)
    }

    /// Accept one event that arrived at `now_us`; append what it releases or reports to `out`.
    pub fn push(&mut self, seq: Seq, payload: P, now_us: Micros, out: &mut Vec<Output<P>>) {
        if seq == self.expected {
            if let Some(last) = self.last_in_order_us {
                self.inter_arrival.update(now_us - last);
            }
            self.last_in_order_us = Some(now_us);
            self.expected = seq + 1;
            self.counters.in_order += 1;
            self.counters.released += 1;
            if self.buffer.is_empty() {
                // the in-order fast path: no state beyond the counters
                self.max_seen = seq;
                out.push(Output::released_on_arrival(payload, seq, now_us, false));
                return;
            }
            let opened = self.holes.pop(seq);
            self.learn_gap_delay(now_us - opened.unwrap_or(now_us));
            self.counters.gaps_closed += 1;
            out.push(Output::released_on_arrival(payload, seq, now_us, false));
            self.release_run(now_us, out, true);
            return;
        }
        if self.adopt_first {
            self.adopt_first = false;
            self.expected = seq;
            self.first_seq = seq;
            self.max_seen = seq - 1;
            return self.push(seq, payload, now_us, out);
        }
        if seq > self.expected {
            self.buffer_early(seq, payload, now_us, out);
        } else {
            self.late(seq, payload, now_us, out);
        }
    }

    /// `push`'s in-order fast path without its output: true when `seq` is the expected seq and nothing is buffered
    /// (the event is released at `now_us`, as `push` would release it); false, and nothing changed, otherwise.
    /// Whether `take_in_order(seq, ..)` would take it: `seq` is the expected seq and nothing is buffered.
    pub fn is_next_in_order(&self, seq: Seq) -> bool {
        seq == self.expected && self.buffer.is_empty()
    }

    pub fn take_in_order(&mut self, seq: Seq, now_us: Micros) -> bool {
        if seq != self.expected || !self.buffer.is_empty() {
            return false;
        }
        if let Some(last) = self.last_in_order_us {
            self.inter_arrival.update(now_us - last);
        }
        self.last_in_order_us = Some(now_us);
        self.expected = seq + 1;
        self.max_seen = seq;
        self.counters.in_order += 1;
        self.counters.released += 1;
        true
    }

    /// Fire every timeout due at or before `now_us`; outputs carry the deadline as their time.
    pub fn advance(&mut self, now_us: Micros, out: &mut Vec<Output<P>>) {
        while let Some(deadline) = self.deadline_us {
            if deadline > now_us {
                break;
            }
            self.skip_head_gap(deadline, GapReason::Timeout, out);
        }
    }

    /// Give up on every gap at once (end of stream): release everything held, in seq order.
    pub fn flush(&mut self, now_us: Micros, out: &mut Vec<Output<P>>) {
        while !self.buffer.is_empty() {
            self.skip_head_gap(now_us, GapReason::Timeout, out);
        }
    }

    fn buffer_early(&mut self, seq: Seq, payload: P, now_us: Micros, out: &mut Vec<Output<P>>) {
        if self.buffer.contains_key(&seq) {
            self.duplicate(seq, payload, now_us, out);
            return;
        }
        if seq > self.max_seen {
            // Holes further back than max_buffered are not tracked: they contribute no delay sample.
            self.holes.add(
                (self.max_seen + 1).max(seq - self.config.max_buffered),
                seq - 1,
                now_us,
            );
            self.max_seen = seq;
        } else if let Some(opened) = self.holes.pop(seq) {
            self.learn_gap_delay(now_us - opened);
            self.counters.gaps_closed += 1;
        }
        let was_empty = self.buffer.is_empty();
        self.buffer.insert(seq, (payload, now_us));
        self.counters.buffered += 1;
        let n = self.buffer.len();
        self.counters.peak_buffered = self.counters.peak_buffered.max(n as u64);
        if was_empty {
            self.open_head_gap(now_us);
        }
        if n as i128 > self.config.max_buffered {
            self.skip_head_gap(now_us, GapReason::BufferFull, out);
        }
    }

    /// A seq seen before (buffered, or released): reported late, never passed on.
    fn duplicate(&mut self, seq: Seq, payload: P, now_us: Micros, out: &mut Vec<Output<P>>) {
        self.counters.duplicates += 1;
        out.push(Output::Late {
            payload,
            seq,
            arrival_us: now_us,
            reason: LateReason::Duplicate,
            lateness_us: 0,
            passed: false,
        });
    }

    fn late(&mut self, seq: Seq, payload: P, now_us: Micros, out: &mut Vec<Output<P>>) {
        let passed = !self.config.drop_late;
        let (reason, lateness_us) = if let Some((opened_us, skipped_us)) = self.skipped.pop(seq) {
            // The feedback the literal thesis timeout lacks: this gap really needed now - opened.
            self.learn_gap_delay(now_us - opened_us);
            (LateReason::LateAfterSkip, now_us - skipped_us)
        } else if seq < self.first_seq {
            (LateReason::BeforeStart, 0)
        } else {
            self.duplicate(seq, payload, now_us, out);
            return;
        };
        self.counters.late += 1;
        if !passed {
            out.push(Output::Late {
                payload,
                seq,
                arrival_us: now_us,
                reason,
                lateness_us,
                passed,
            });
            return;
        }
        self.counters.late_passed += 1;
        self.counters.released += 1;
        out.push(Output::Late {
            payload: payload.clone(),
            seq,
            arrival_us: now_us,
            reason,
            lateness_us,
            passed,
        });
        out.push(Output::released_on_arrival(payload, seq, now_us, true));
    }

    fn learn_gap_delay(&mut self, delay_us: Micros) {
        self.gap_delay.add(delay_us);
        self.longest_gap_delay_us = self.longest_gap_delay_us.max(delay_us);
    }

    fn open_head_gap(&mut self, now_us: Micros) {
        self.head_since_us = now_us;
        self.deadline_us = Some(now_us + self.timeout_us());
    }

    fn release_run(&mut self, now_us: Micros, out: &mut Vec<Output<P>>, learn: bool) {
        let mut expected = self.expected;
        let mut released = 0;
        while let Some((payload, arrival_us)) = self.buffer.remove(&expected) {
            if learn {
                // Eq. 3.7-3.10 learn only from gaps that closed in time
                self.buffer_delay.update(now_us - arrival_us);
            }
            out.push(Output::Released {
                payload,
                seq: expected,
                arrival_us,
                release_us: now_us,
                late: false,
            });
            expected += 1;
            released += 1;
        }
        self.expected = expected;
        self.counters.released += released;
        if self.buffer.is_empty() {
            self.deadline_us = None;
        } else {
            self.open_head_gap(now_us);
        }
    }

    fn skip_head_gap(&mut self, at_us: Micros, reason: GapReason, out: &mut Vec<Output<P>>) {
        let first = self.expected;
        let Some(&resume) = self.buffer.keys().next() else {
            // unreachable: a deadline is set only while events are held; a clear state beats a panic
            self.deadline_us = None;
            return;
        };
        let limit = self.config.max_skipped_tracked;
        // Each skipped seq keeps the time its hole became visible (the head gap's opening when it was not
        // tracked), one entry per run of seqs that share it; only the newest `limit` skipped seqs are kept.
        let tracked_from = first.max(resume - limit);
        let head_since_us = self.head_since_us;
        let mut cursor = first;
        for (lo, hi, opened_us) in self.holes.pop_range(first, resume - 1) {
            self.skipped
                .add(cursor.max(tracked_from), lo - 1, (head_since_us, at_us));
            self.skipped
                .add(lo.max(tracked_from), hi, (opened_us, at_us));
            cursor = hi + 1;
        }
        self.skipped
            .add(cursor.max(tracked_from), resume - 1, (head_since_us, at_us));
        self.skipped.trim_low(limit);
        self.skipped.drop_first_ranges(MAX_SKIPPED_RANGES);
        self.counters.skipped_seqs += resume - first;
        match reason {
            GapReason::Timeout => self.counters.timeouts += 1,
            GapReason::BufferFull => self.counters.buffer_full_skips += 1,
        }
        out.push(Output::GapSkipped {
            first_seq: first,
            last_seq: resume - 1,
            waited_us: at_us - head_since_us,
            at_us,
            reason,
        });
        self.expected = resume;
        self.release_run(at_us, out, false);
    }
}

/// Python's `max(a, b, c)` of floats: the first of the largest.
fn py_max3(a: f64, b: f64, c: f64) -> f64 {
    let mut m = a;
    if b > m {
        m = b;
    }
    if c > m {
        m = c;
    }
    m
}

#[cfg(test)]
mod tests;
