//! The multi-source merger per stream, compiled: a port of `reorder/merger.py` (`MultiSourceMerger`), its
//! executable specification, with identical decisions. Thesis section 3.2.2 plus exact watermarks, punctuation,
//! the learned merge wait, give-ups, departures and caught-up heartbeats: the Python module's docstring is the
//! description; comments here say only where the port differs in means, never in outcome.
//!
//! Means, not outcomes:
//! - Sources live in an append-only slot list (insertion order, as the Python dict iterates), found by name through
//!   a hash map; the heaps hold `(time, name)` keys as Python's do (ties broken by the name), plus the slot.
//! - Events are opaque handles `E` (the Python wrapper stores the event object); the merger reads only the seq and
//!   the mapping `(ref_us, error_us)` the caller made.
//! - The per-source wait (`timeout_for`) is a [`WaitPolicy`] passed to each call.
//! - Every time and bound is checked to lie within +-[`TIME_LIMIT_US`] on the way in, so no sum or difference the
//!   merge forms overflows an `i64` (Python's integers are unbounded; no real microsecond time comes near 2^61).

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

pub mod held;
pub mod python;

use crate::sequence::estimators::DecayedQuantile;

/// Python's `_NEVER`: below any time the merge sees.
pub const NEVER: i64 = -(1 << 62);
/// `reorder.merger.VIRTUAL_TIME_FLOOR_US`: a `min_watermark_us` for virtual time.
pub const VIRTUAL_TIME_FLOOR_US: i64 = NEVER / 2 + 1;
/// Every time (`now_us`, `arrival_us`, a mapped `ref_us`, a restored watermark) and every duration (an error bound,
/// a wait, a config interval) must lie within +-2^61 us (73,000 years): then no sum or difference of two or three of
/// them overflows, and none is below [`NEVER`].
pub const TIME_LIMIT_US: i64 = 1 << 61;
pub const DEFAULT_MAX_QUEUED: i64 = 200_000;
pub const DEFAULT_LEARNED_WAIT_CAP_US: i64 = 2_000_000;
pub const DEFAULT_MIN_WAIT_SAMPLES: i64 = 1_000;
/// `contract.records.MIN_TS_US`.
pub const MIN_TS_US: i64 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Watermark,
    Thesis,
}

/// `reorder.merger.MergerConfig`, field for field.
#[derive(Debug, Clone, PartialEq)]
pub struct MergerConfig {
    pub mode: Mode,
    pub default_timeout_us: i64,
    pub punctuation_interval_us: i64,
    pub max_queued_per_source: i64,
    pub learn_wait: bool,
    pub learned_wait_cap_us: i64,
    pub wait_quantile: f64,
    pub wait_factor: f64,
    pub wait_half_life: f64,
    pub min_wait_samples: i64,
    pub min_watermark_us: i64,
}

impl Default for MergerConfig {
    fn default() -> Self {
        MergerConfig {
            mode: Mode::Watermark,
            default_timeout_us: 500_000,
            punctuation_interval_us: 1_000,
            max_queued_per_source: DEFAULT_MAX_QUEUED,
            learn_wait: true,
            learned_wait_cap_us: DEFAULT_LEARNED_WAIT_CAP_US,
            wait_quantile: 0.9999,
            wait_factor: 2.0,
            wait_half_life: 10_000.0,
            min_wait_samples: DEFAULT_MIN_WAIT_SAMPLES,
            min_watermark_us: MIN_TS_US,
        }
    }
}

impl MergerConfig {
    /// Python's `__post_init__` checks, plus what the Python core only fails on later (a zero half-life divides by
    /// zero at the first source) or never checks (times outside +-[`TIME_LIMIT_US`], non-finite factors).
    pub fn validate(&self) -> Result<(), MergeError> {
        if !(self.wait_quantile > 0.0 && self.wait_quantile < 1.0) {
            return Err(MergeError::Config("wait_quantile must be in (0, 1)"));
        }
        if self.learned_wait_cap_us < 0 {
            return Err(MergeError::Config("learned_wait_cap_us must be >= 0"));
        }
        if self.min_wait_samples < 0 {
            return Err(MergeError::Config("min_wait_samples must be >= 0"));
        }
        if !self.wait_factor.is_finite() {
            return Err(MergeError::Config("wait_factor must be finite"));
        }
        if !(self.wait_half_life.is_finite() && self.wait_half_life > 0.0) {
            return Err(MergeError::Config("wait_half_life must be finite and > 0"));
        }
        for (name, value) in [
            ("default_timeout_us", self.default_timeout_us),
            ("punctuation_interval_us", self.punctuation_interval_us),
            ("learned_wait_cap_us", self.learned_wait_cap_us),
            ("min_watermark_us", self.min_watermark_us),
        ] {
            check_time(name, value)?;
        }
        Ok(())
    }
}

/// `reorder.merger.MergerCounters`, field for field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergerCounters {
    pub merged: u64,
    pub timeouts: u64,
    pub late: u64,
    pub punctuations: u64,
    pub heartbeats: u64,
    pub peak_queued: u64,
    pub raised: u64,
    pub stamp_regressions: u64,
    pub after_give_up: u64,
    pub departures: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateReason {
    AfterPunctuation,
    StampRegression,
    AfterGiveUp,
}

impl LateReason {
    pub fn as_str(self) -> &'static str {
        match self {
            LateReason::AfterPunctuation => "after_punctuation",
            LateReason::StampRegression => "stamp_regression",
            LateReason::AfterGiveUp => "after_give_up",
        }
    }
}

/// `reorder.merger.MergeOutput` (the stream is the merger's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeOutput<E> {
    Merged {
        event: E,
        arrival_us: i64,
        release_us: i64,
        ref_ts_us: i64,
        raised_us: i64,
    },
    Punctuation {
        watermark_us: i64,
        at_us: i64,
    },
    SourceTimedOut {
        source_id: Arc<str>,
        at_us: i64,
    },
    Late {
        event: E,
        arrival_us: i64,
        reason: LateReason,
        lateness_us: i64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeError {
    Config(&'static str),
    /// A time or bound outside what the merge accepts (named, with its value); nothing was changed.
    OutOfRange {
        what: &'static str,
        value: i64,
    },
}

impl fmt::Display for MergeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MergeError::Config(why) => write!(f, "MergerConfig: {why}"),
            MergeError::OutOfRange { what, value } if *what == "error_us" => {
                write!(f, "merger: error_us {value} is outside [0, 2^61]")
            }
            MergeError::OutOfRange { what, value } => {
                write!(
                    f,
                    "merger: {what} {value} is outside [-2^61, 2^61] microseconds"
                )
            }
        }
    }
}

impl std::error::Error for MergeError {}

fn check_time(what: &'static str, value: i64) -> Result<(), MergeError> {
    if (-TIME_LIMIT_US..=TIME_LIMIT_US).contains(&value) {
        Ok(())
    } else {
        Err(MergeError::OutOfRange { what, value })
    }
}

fn check_mapping(ref_us: i64, error_us: i64) -> Result<(), MergeError> {
    check_time("ref_us", ref_us)?;
    if (0..=TIME_LIMIT_US).contains(&error_us) {
        Ok(())
    } else {
        Err(MergeError::OutOfRange {
            what: "error_us",
            value: error_us,
        })
    }
}

/// How long to wait for a silent source (`timeout_for(source_id, now_us)`); None: the config's
/// `default_timeout_us` (Python's `timeout_for=None`). A value outside +-[`TIME_LIMIT_US`] is clamped to it.
pub trait WaitPolicy {
    fn wait_us(&mut self, source_id: &str, now_us: i64) -> Option<i64>;
}

/// No per-source wait: every silent source gets `default_timeout_us`.
pub struct DefaultWait;

impl WaitPolicy for DefaultWait {
    fn wait_us(&mut self, _source_id: &str, _now_us: i64) -> Option<i64> {
        None
    }
}

impl<F: FnMut(&str, i64) -> i64> WaitPolicy for F {
    fn wait_us(&mut self, source_id: &str, now_us: i64) -> Option<i64> {
        Some(self(source_id, now_us))
    }
}

/// One event of a [`MultiSourceMerger::push_run`]: its seq, handle, arrival and mapping.
#[derive(Debug, Clone)]
pub struct RunEvent<E> {
    pub seq: i64,
    pub event: E,
    pub arrival_us: i64,
    pub ref_us: i64,
    pub error_us: i64,
}

/// FxHash (rustc's): source names are short and chosen by the gateway's sessions, not by an attacker who could aim
/// collisions at one stream's map without first authenticating as many sources.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
        }
        for &byte in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type NameMap = HashMap<Arc<str>, u32, BuildHasherDefault<FxHasher>>;

/// A heap key `(time, name)` as Python's heaps order them, with the source's slot (not part of the order).
#[derive(Debug, Clone)]
struct Entry {
    time_us: i64,
    name: Arc<str>,
    slot: u32,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        // Python compares str by code point; UTF-8 bytes order the same way.
        self.time_us
            .cmp(&other.time_us)
            .then_with(|| self.name.as_bytes().cmp(other.name.as_bytes()))
    }
}

type MinHeap = BinaryHeap<Reverse<Entry>>;

#[derive(Debug)]
struct Queued<E> {
    ref_us: i64,
    event: E,
    arrival_us: i64,
    raised_us: i64,
}

#[derive(Debug)]
struct Source<E> {
    name: Arc<str>,
    queue: VecDeque<Queued<E>>,
    frontier: i64,
    frontier_error_us: i64,
    error_us: i64,
    last_seq: Option<i64>,
    /// (seq, ref_us, error_us) of a heartbeat not yet covered by delivered events
    pending_beat: Option<(i64, i64, i64)>,
    timed_out: bool,
    leaving: bool,
    wait_deadline: Option<i64>,
    heard_us: Option<i64>,
    waited_since: Option<i64>,
    silences: Option<DecayedQuantile>,
}

impl<E> Source<E> {
    fn new(name: Arc<str>, silences: Option<DecayedQuantile>) -> Self {
        Source {
            name,
            queue: VecDeque::new(),
            frontier: NEVER,
            frontier_error_us: 0,
            error_us: 0,
            last_seq: None,
            pending_beat: None,
            timed_out: false,
            leaving: false,
            wait_deadline: None,
            heard_us: None,
            waited_since: None,
            silences,
        }
    }

    /// `_advance_frontier`: the source delivered (or promised) `ref_us`, its true time at most `error_us` below it.
    fn advance_frontier(&mut self, ref_us: i64, error_us: i64) {
        match ref_us.cmp(&self.frontier) {
            Ordering::Greater => {
                self.frontier = ref_us;
                self.frontier_error_us = error_us;
            }
            Ordering::Equal => self.frontier_error_us = self.frontier_error_us.min(error_us),
            Ordering::Less => {}
        }
    }

    /// Reference order: an event is not queued below what was released, nor below this source's queued events, nor
    /// below the punctuation (one at or below its frontier: a re-sync may place it there).
    fn floor_us(&self, released_max: i64, promised: i64) -> i64 {
        self.queue
            .back()
            .map_or(released_max, |q| q.ref_us)
            .max(released_max)
            .max(promised)
    }

    /// `_allowed_us`
    fn allowed_us(&self, floor_us: i64, error_us: i64) -> i64 {
        if floor_us <= self.frontier {
            error_us + self.frontier_error_us
        } else {
            error_us
        }
    }

    /// `_bound_us`
    fn bound_us(&self) -> i64 {
        self.queue.front().map_or(self.frontier, |q| q.ref_us) - self.error_us
    }
}

/// Merges the ordered per-source queues of one stream by reference timestamp (`reorder.merger.MultiSourceMerger`).
pub struct MultiSourceMerger<E> {
    config: MergerConfig,
    counters: MergerCounters,
    /// In registration order; None where a source was forgotten (compacted away when holes dominate).
    slots: Vec<Option<Source<E>>>,
    holes: usize,
    by_name: NameMap,
    heads: MinHeap,
    empty: MinHeap,
    blocker: Option<u32>,
    emitted_watermark: i64,
    next_punctuation_us: i64,
    watermark_holder: Option<u32>,
    released_max: i64,
    queued: u64,
    flushing: bool,
    /// Buckets of a source's silences (the same for every source of this merger).
    silence_max_us: i64,
}

impl<E> MultiSourceMerger<E> {
    pub fn new(config: MergerConfig) -> Result<Self, MergeError> {
        config.validate()?;
        let silence_max_us = config.learned_wait_cap_us.max(2);
        Ok(MultiSourceMerger {
            config,
            counters: MergerCounters::default(),
            slots: Vec::new(),
            holes: 0,
            by_name: NameMap::default(),
            heads: MinHeap::new(),
            empty: MinHeap::new(),
            blocker: None,
            emitted_watermark: NEVER,
            next_punctuation_us: NEVER,
            watermark_holder: None,
            released_max: NEVER,
            queued: 0,
            flushing: false,
            silence_max_us,
        })
    }

    // -- queries ----------------------------------------------------------------------------------------------

    pub fn config(&self) -> &MergerConfig {
        &self.config
    }

    pub fn counters(&self) -> &MergerCounters {
        &self.counters
    }

    /// The latest punctuated watermark, or None before the first.
    pub fn watermark_us(&self) -> Option<i64> {
        (self.emitted_watermark != NEVER).then_some(self.emitted_watermark)
    }

    pub fn queued(&self) -> u64 {
        self.queued
    }

    /// Events waiting in each source's queue (only sources with some), from the heads heap.
    pub fn queued_by_source(&self) -> Vec<(Arc<str>, usize)> {
        self.heads
            .iter()
            .map(|Reverse(e)| (e.name.clone(), self.src(e.slot).queue.len()))
            .collect()
    }

    /// The registered sources, in registration order.
    pub fn sources(&self) -> impl Iterator<Item = &str> + '_ {
        self.slots.iter().flatten().map(|s| &*s.name)
    }

    /// None for a source the merge does not know (Python raises KeyError).
    pub fn is_timed_out(&self, source_id: &str) -> Option<bool> {
        self.by_name
            .get(source_id)
            .map(|&slot| self.src(slot).timed_out)
    }

    pub fn next_deadline_us(&self) -> Option<i64> {
        self.blocker.and_then(|slot| self.src(slot).wait_deadline)
    }

    /// Events queued for `source_id`; None if the merge does not know it.
    pub fn queued_of(&self, source_id: &str) -> Option<usize> {
        self.by_name
            .get(source_id)
            .map(|&slot| self.src(slot).queue.len())
    }

    /// Whether the merge is holding other sources' events for this one.
    pub fn waits_for(&self, source_id: &str) -> bool {
        self.blocker.is_some() && self.blocker == self.by_name.get(source_id).copied()
    }

    // -- input ------------------------------------------------------------------------------------------------

    /// `push(event, arrival_us, now_us, late=..., mapped=(ref_us, error_us))`: an event released by its source's
    /// reorderer, with the mapping the caller made.
    #[allow(clippy::too_many_arguments)]
    pub fn push<P: WaitPolicy + ?Sized>(
        &mut self,
        source_id: &str,
        seq: i64,
        event: E,
        arrival_us: i64,
        now_us: i64,
        late: bool,
        mapped: (i64, i64),
        policy: &mut P,
        out: &mut Vec<MergeOutput<E>>,
    ) -> Result<(), MergeError> {
        check_time("arrival_us", arrival_us)?;
        check_time("now_us", now_us)?;
        let (mut ref_us, err) = mapped;
        check_mapping(ref_us, err)?;
        let slot = self.source(source_id);
        self.src_mut(slot).error_us = err;
        self.revive(slot, now_us, true);
        let watermark_mode = self.config.mode == Mode::Watermark;
        let promised = self.emitted_watermark;
        let released_max = self.released_max;
        let src = live(&mut self.slots, slot);
        if watermark_mode && !late && src.frontier - ref_us > err + src.frontier_error_us {
            // its source's stamps went backwards along its seqs
            if seq > src.last_seq.unwrap_or(NEVER) {
                src.last_seq = Some(seq);
            }
            let frontier = src.frontier;
            self.regressed(slot, event, arrival_us, ref_us, frontier, out);
            self.drain(now_us, policy, out);
            return Ok(());
        }
        if watermark_mode && ref_us < promised && (late || promised > src.frontier) {
            self.after_punctuation(event, arrival_us, ref_us, out);
            // reviving cancelled any wait on this source: decide again, or the merge is left without a deadline
            self.drain(now_us, policy, out);
            return Ok(());
        }
        if late {
            // passed through by the reorderer's configuration: already behind, not held
            self.counters.merged += 1;
            out.push(MergeOutput::Merged {
                event,
                arrival_us,
                release_us: now_us.max(arrival_us),
                ref_ts_us: ref_us,
                raised_us: 0,
            });
            self.drain(now_us, policy, out);
            return Ok(());
        }
        if seq > src.last_seq.unwrap_or(NEVER) {
            src.last_seq = Some(seq);
        }
        let mut raised = 0;
        if watermark_mode {
            let floor = src.floor_us(released_max, promised);
            if ref_us < floor {
                if floor - ref_us > src.allowed_us(floor, err) {
                    if ref_us < promised {
                        self.after_punctuation(event, arrival_us, ref_us, out);
                    } else {
                        self.regressed(slot, event, arrival_us, ref_us, floor, out);
                    }
                    self.drain(now_us, policy, out);
                    return Ok(());
                }
                raised = floor - ref_us;
                ref_us = floor;
                self.counters.raised += 1;
            }
        }
        src.advance_frontier(ref_us, err + raised);
        self.apply_pending_beat(slot);
        let src = live(&mut self.slots, slot);
        let was_empty = src.queue.is_empty();
        src.queue.push_back(Queued {
            ref_us,
            event,
            arrival_us,
            raised_us: raised,
        });
        let over_limit = src.queue.len() as i64 > self.config.max_queued_per_source;
        self.queued += 1;
        self.counters.peak_queued = self.counters.peak_queued.max(self.queued);
        if was_empty {
            self.heads.push(Reverse(Entry {
                time_us: ref_us,
                name: src.name.clone(),
                slot,
            }));
        }
        if over_limit {
            if let Some(blocker) = self.blocker {
                self.time_out(blocker, now_us, out);
            }
        }
        self.drain(now_us, policy, out);
        Ok(())
    }

    /// `push_run`: events of one source released by its reorderer in one call, in seq order, each with its arrival
    /// and mapping; the merge is drained once per stretch of them that is not late. Checked whole before any is
    /// taken.
    pub fn push_run<P: WaitPolicy + ?Sized>(
        &mut self,
        source_id: &str,
        run: Vec<RunEvent<E>>,
        now_us: i64,
        policy: &mut P,
        out: &mut Vec<MergeOutput<E>>,
    ) -> Result<(), MergeError> {
        check_time("now_us", now_us)?;
        for item in &run {
            check_time("arrival_us", item.arrival_us)?;
            check_mapping(item.ref_us, item.error_us)?;
        }
        let slot = self.source(source_id);
        self.revive(slot, now_us, true);
        let watermark_mode = self.config.mode == Mode::Watermark;
        let limit = self.config.max_queued_per_source;
        let mut start = self.src(slot).queue.len();
        for RunEvent {
            seq,
            event,
            arrival_us,
            ref_us,
            error_us: err,
        } in run
        {
            let promised = self.emitted_watermark;
            let released_max = self.released_max;
            let src = live(&mut self.slots, slot);
            src.error_us = err;
            if watermark_mode && src.frontier - ref_us > err + src.frontier_error_us {
                start = self.close_stretch(slot, start, now_us, policy, out);
                let src = live(&mut self.slots, slot);
                if src.last_seq.map_or(true, |last| seq > last) {
                    src.last_seq = Some(seq);
                }
                let frontier = src.frontier;
                self.regressed(slot, event, arrival_us, ref_us, frontier, out);
                continue;
            }
            if watermark_mode && ref_us < promised && promised > src.frontier {
                start = self.close_stretch(slot, start, now_us, policy, out);
                self.after_punctuation(event, arrival_us, ref_us, out);
                continue;
            }
            if src.last_seq.map_or(true, |last| seq > last) {
                src.last_seq = Some(seq);
            }
            let (mut raised, mut queued_ref) = (0, ref_us);
            if watermark_mode {
                let floor = src.floor_us(released_max, promised);
                if ref_us < floor {
                    if floor - ref_us > src.allowed_us(floor, err) {
                        start = self.close_stretch(slot, start, now_us, policy, out);
                        if ref_us < promised {
                            self.after_punctuation(event, arrival_us, ref_us, out);
                        } else {
                            self.regressed(slot, event, arrival_us, ref_us, floor, out);
                        }
                        continue;
                    }
                    self.counters.raised += 1;
                    (raised, queued_ref) = (floor - ref_us, floor);
                }
            }
            src.advance_frontier(queued_ref, err + raised);
            src.queue.push_back(Queued {
                ref_us: queued_ref,
                event,
                arrival_us,
                raised_us: raised,
            });
            if src.queue.len() as i64 > limit {
                if let Some(blocker) = self.blocker {
                    self.time_out(blocker, now_us, out);
                }
            }
        }
        if self.src(slot).queue.len() > start {
            self.close_stretch(slot, start, now_us, policy, out);
        } else {
            self.drain(now_us, policy, out);
        }
        Ok(())
    }

    /// After a restart: a watermark already promised downstream stays promised.
    pub fn restore_watermark(&mut self, watermark_us: i64) -> Result<(), MergeError> {
        check_time("watermark_us", watermark_us)?;
        self.emitted_watermark = self.emitted_watermark.max(watermark_us);
        Ok(())
    }

    /// Announce a source: from now on the merge waits for it.
    pub fn register<P: WaitPolicy + ?Sized>(
        &mut self,
        source_id: &str,
        now_us: i64,
        policy: &mut P,
        out: &mut Vec<MergeOutput<E>>,
    ) -> Result<(), MergeError> {
        self.heard(source_id, now_us, true, policy, out)
    }

    /// `hear` (`silence_ends` false): the source spoke, yet nothing of it reached the merge (its reorderer holds it
    /// behind a gap): the merge waits for it afresh from now; its measured silence goes on until its next release.
    /// `register` (true): announced, its silence ends here.
    pub fn heard<P: WaitPolicy + ?Sized>(
        &mut self,
        source_id: &str,
        now_us: i64,
        silence_ends: bool,
        policy: &mut P,
        out: &mut Vec<MergeOutput<E>>,
    ) -> Result<(), MergeError> {
        check_time("now_us", now_us)?;
        let slot = self.source(source_id);
        self.revive(slot, now_us, silence_ends);
        self.drain(now_us, policy, out);
        Ok(())
    }

    /// `note_heard`: when the source was last heard of, and nothing else (a wait already started keeps its
    /// deadline); an unknown source is no-op.
    pub fn note_heard(&mut self, source_id: &str, now_us: i64) {
        if let Some(&slot) = self.by_name.get(source_id) {
            live(&mut self.slots, slot).heard_us = Some(now_us);
        }
    }

    /// Drop a source that holds nothing; refused (false) while its queue is not empty or the merge waits for it.
    pub fn forget(&mut self, source_id: &str) -> bool {
        let Some(&slot) = self.by_name.get(source_id) else {
            return false;
        };
        if !self.src(slot).queue.is_empty() || self.blocker == Some(slot) {
            return false;
        }
        self.by_name.remove(source_id);
        self.slots[slot as usize] = None;
        self.holes += 1;
        if self.watermark_holder == Some(slot) {
            self.watermark_holder = None;
        }
        if self.holes > 32 && self.holes * 2 > self.slots.len() {
            self.compact();
        }
        true
    }

    /// Proof of life: the source had sent every event up to `seq` when its clock mapped to `mapped`.
    /// `caught_up`: every event up to `seq` has reached the merge, or never will through it.
    #[allow(clippy::too_many_arguments)]
    pub fn heartbeat<P: WaitPolicy + ?Sized>(
        &mut self,
        source_id: &str,
        seq: i64,
        now_us: i64,
        caught_up: bool,
        mapped: (i64, i64),
        policy: &mut P,
        out: &mut Vec<MergeOutput<E>>,
    ) -> Result<(), MergeError> {
        check_time("now_us", now_us)?;
        let (ref_us, err) = mapped;
        check_mapping(ref_us, err)?;
        let slot = self.source(source_id);
        let src = live(&mut self.slots, slot);
        if caught_up && src.last_seq.map_or(true, |last| last < seq) {
            src.last_seq = Some(seq);
        }
        src.error_us = err;
        let delivered = src.last_seq.unwrap_or(-1);
        let revive = self.config.mode != Mode::Watermark
            || (delivered >= seq && ref_us > src.frontier)
            || !(src.timed_out || src.wait_deadline.is_some());
        self.counters.heartbeats += 1;
        if revive {
            self.revive(slot, now_us, true);
        }
        // Otherwise the merge waits for this source (or gave it up) and the heartbeat promises nothing beyond its
        // frontier: reviving it would restart the wait at every heartbeat.
        let src = live(&mut self.slots, slot);
        if src
            .pending_beat
            .map_or(true, |(beat_seq, _, _)| seq >= beat_seq)
        {
            src.pending_beat = Some((seq, ref_us, err));
        }
        self.apply_pending_beat(slot);
        self.drain(now_us, policy, out);
        Ok(())
    }

    /// The source left cleanly (a bye): given up at once, or once its queued events are released.
    pub fn leave<P: WaitPolicy + ?Sized>(
        &mut self,
        source_id: &str,
        now_us: i64,
        policy: &mut P,
        out: &mut Vec<MergeOutput<E>>,
    ) -> Result<(), MergeError> {
        check_time("now_us", now_us)?;
        let Some(&slot) = self.by_name.get(source_id) else {
            return Ok(());
        };
        let src = live(&mut self.slots, slot);
        if src.timed_out || src.leaving {
            return Ok(());
        }
        self.counters.departures += 1;
        if !src.queue.is_empty() {
            src.leaving = true;
        } else {
            self.depart_promising(slot, now_us, out);
        }
        self.drain(now_us, policy, out);
        Ok(())
    }

    /// Fire the wait on a silent source if its deadline is at or before `now_us`.
    pub fn advance<P: WaitPolicy + ?Sized>(
        &mut self,
        now_us: i64,
        policy: &mut P,
        out: &mut Vec<MergeOutput<E>>,
    ) -> Result<(), MergeError> {
        check_time("now_us", now_us)?;
        while let Some(blocker) = self.blocker {
            let Some(deadline) = self.src(blocker).wait_deadline else {
                break;
            };
            if deadline > now_us {
                break;
            }
            self.time_out(blocker, deadline, out);
            self.drain(deadline, policy, out);
        }
        Ok(())
    }

    /// End of stream: release everything queued in reference order without waiting.
    pub fn flush(&mut self, now_us: i64, out: &mut Vec<MergeOutput<E>>) -> Result<(), MergeError> {
        check_time("now_us", now_us)?;
        self.flushing = true;
        // While flushing no source blocks, so the policy is never asked.
        self.drain(now_us, &mut DefaultWait, out);
        self.flushing = false;
        Ok(())
    }

    // -- internals --------------------------------------------------------------------------------------------

    fn src(&self, slot: u32) -> &Source<E> {
        // Slots held by the heaps' live entries, the blocker and the holder always name a live source (they are
        // dropped or remapped when it is forgotten or compacted); a stale heap entry is checked with `get` first.
        self.slots[slot as usize]
            .as_ref()
            .expect("a live source's slot")
    }

    fn src_mut(&mut self, slot: u32) -> &mut Source<E> {
        self.slots[slot as usize]
            .as_mut()
            .expect("a live source's slot")
    }

    /// `_source`: the slot of `source_id`, registered now if new.
    fn source(&mut self, source_id: &str) -> u32 {
        if let Some(&slot) = self.by_name.get(source_id) {
            return slot;
        }
        let cfg = &self.config;
        let silences = (cfg.learn_wait && cfg.mode == Mode::Watermark).then(|| {
            DecayedQuantile::new(cfg.wait_quantile, cfg.wait_half_life, self.silence_max_us)
        });
        let name: Arc<str> = Arc::from(source_id);
        let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 sources");
        self.slots.push(Some(Source::new(name.clone(), silences)));
        self.by_name.insert(name.clone(), slot);
        self.empty.push(Reverse(Entry {
            time_us: NEVER,
            name,
            slot,
        }));
        slot
    }

    fn compact(&mut self) {
        let mut remap = vec![u32::MAX; self.slots.len()];
        let mut kept = Vec::with_capacity(self.slots.len() - self.holes);
        for (old, slot) in std::mem::take(&mut self.slots).into_iter().enumerate() {
            if let Some(src) = slot {
                remap[old] = kept.len() as u32;
                kept.push(Some(src));
            }
        }
        self.slots = kept;
        self.holes = 0;
        for (index, src) in self.slots.iter().flatten().enumerate() {
            self.by_name.insert(src.name.clone(), index as u32);
        }
        let rebuild = |heap: &mut MinHeap| {
            let entries: Vec<_> = std::mem::take(heap)
                .into_iter()
                .filter_map(|Reverse(mut e)| {
                    let new = remap[e.slot as usize];
                    (new != u32::MAX).then(|| {
                        e.slot = new;
                        Reverse(e)
                    })
                })
                .collect();
            *heap = MinHeap::from(entries);
        };
        rebuild(&mut self.heads);
        rebuild(&mut self.empty);
        self.blocker = self.blocker.map(|slot| remap[slot as usize]);
        self.watermark_holder = self.watermark_holder.map(|slot| remap[slot as usize]);
    }

    fn revive(&mut self, slot: u32, now_us: i64, silence_ends: bool) {
        if self.blocker == Some(slot) {
            self.blocker = None;
        }
        let src = live(&mut self.slots, slot);
        src.heard_us = Some(now_us);
        if silence_ends {
            if let Some(since) = src.waited_since.take() {
                // the silence the merge waited through ends here, whether or not the wait had given up
                if let Some(silences) = src.silences.as_mut() {
                    silences.add(i128::from(now_us - since));
                }
            }
        }
        src.wait_deadline = None;
        src.leaving = false;
        if src.timed_out {
            src.timed_out = false;
            if src.queue.is_empty() {
                self.empty.push(Reverse(Entry {
                    time_us: src.frontier,
                    name: src.name.clone(),
                    slot,
                }));
            }
        }
    }

    /// `_apply_pending_beat`: advance the frontier to a heartbeat's clock once every event up to its seq was
    /// delivered.
    fn apply_pending_beat(&mut self, slot: u32) {
        if self.config.mode != Mode::Watermark {
            return;
        }
        let src = self.src_mut(slot);
        let Some((seq, ref_us, err)) = src.pending_beat else {
            return;
        };
        if src.last_seq.unwrap_or(-1) < seq {
            return;
        }
        src.pending_beat = None;
        let moved = ref_us > src.frontier;
        src.advance_frontier(ref_us, err);
        if moved && src.queue.is_empty() && !src.timed_out {
            // the old (lower) entry of this source becomes stale and is dropped lazily
            let entry = Entry {
                time_us: ref_us,
                name: src.name.clone(),
                slot,
            };
            self.empty.push(Reverse(entry));
        }
    }

    /// `_top_blocker`: the empty live source with the lowest frontier, if it could still send something below
    /// `ref_us`.
    fn top_blocker(&mut self, ref_us: i64) -> Option<u32> {
        if self.flushing {
            return None;
        }
        let thesis = self.config.mode == Mode::Thesis;
        while let Some(Reverse(top)) = self.empty.peek() {
            let live = match self.slots.get(top.slot as usize) {
                Some(Some(src)) => {
                    src.queue.is_empty() && !src.timed_out && src.frontier == top.time_us
                }
                _ => false,
            };
            if !live {
                self.empty.pop(); // stale entry
                continue;
            }
            return (thesis || top.time_us < ref_us).then_some(top.slot);
        }
        None
    }

    /// `_learned_wait_us`: `min(cap, wait_factor x q-quantile)`, the cap until trusted.
    fn learned_wait_us(config: &MergerConfig, silences: &mut DecayedQuantile) -> i64 {
        if (silences.count() as i128) < i128::from(config.min_wait_samples) {
            return config.learned_wait_cap_us;
        }
        // Python's int() truncates toward zero; `as` does too (saturating, where min() then takes the cap).
        config
            .learned_wait_cap_us
            .min((config.wait_factor * silences.value_us() as f64) as i64)
    }

    fn time_out(&mut self, slot: u32, at_us: i64, out: &mut Vec<MergeOutput<E>>) {
        let src = self.src_mut(slot);
        src.timed_out = true;
        src.wait_deadline = None;
        let source_id = src.name.clone();
        if self.blocker == Some(slot) {
            self.blocker = None;
        }
        self.counters.timeouts += 1;
        out.push(MergeOutput::SourceTimedOut { source_id, at_us });
    }

    fn after_punctuation(
        &mut self,
        event: E,
        arrival_us: i64,
        ref_us: i64,
        out: &mut Vec<MergeOutput<E>>,
    ) {
        self.counters.late += 1;
        let lateness_us = self.emitted_watermark - ref_us;
        out.push(MergeOutput::Late {
            event,
            arrival_us,
            reason: LateReason::AfterPunctuation,
            lateness_us,
        });
    }

    /// `_regressed`: below `floor` by more than its error bound: `stamp_regression` when below its own source's
    /// frontier, `after_give_up` otherwise.
    fn regressed(
        &mut self,
        slot: u32,
        event: E,
        arrival_us: i64,
        ref_us: i64,
        floor: i64,
        out: &mut Vec<MergeOutput<E>>,
    ) {
        self.counters.late += 1;
        let reason = if ref_us < self.src(slot).frontier {
            self.counters.stamp_regressions += 1;
            LateReason::StampRegression
        } else {
            self.counters.after_give_up += 1;
            LateReason::AfterGiveUp
        };
        out.push(MergeOutput::Late {
            event,
            arrival_us,
            reason,
            lateness_us: floor - ref_us,
        });
    }

    /// `_close_stretch` with `_end_stretch`: if the source's queue grew from `start` events in this run, that stretch
    /// ends: its events are accounted for and the merge drained once. Returns where the next stretch starts.
    fn close_stretch<P: WaitPolicy + ?Sized>(
        &mut self,
        slot: u32,
        start: usize,
        now_us: i64,
        policy: &mut P,
        out: &mut Vec<MergeOutput<E>>,
    ) -> usize {
        if self.src(slot).queue.len() > start {
            self.apply_pending_beat(slot);
            let src = self.src(slot);
            let grown = (src.queue.len() - start) as u64;
            let head = (start == 0).then(|| Entry {
                time_us: src.queue[0].ref_us,
                name: src.name.clone(),
                slot,
            });
            self.queued += grown;
            self.counters.peak_queued = self.counters.peak_queued.max(self.queued);
            if let Some(entry) = head {
                self.heads.push(Reverse(entry));
            }
            self.drain(now_us, policy, out);
        }
        self.src(slot).queue.len()
    }

    fn depart_promising(&mut self, slot: u32, now_us: i64, out: &mut Vec<MergeOutput<E>>) {
        if self.config.mode == Mode::Watermark {
            self.punctuate(now_us, out);
        }
        self.depart(slot);
    }

    fn depart(&mut self, slot: u32) {
        let src = self.src_mut(slot);
        src.leaving = false;
        src.timed_out = true;
        src.wait_deadline = None;
        src.waited_since = None; // a departure is no silence to learn a wait from
        if self.blocker == Some(slot) {
            self.blocker = None;
        }
    }

    /// Start the wait for `slot`, the source that now blocks the merge.
    fn start_wait<P: WaitPolicy + ?Sized>(&mut self, slot: u32, now_us: i64, policy: &mut P) {
        let config = &self.config;
        let src = self.slots[slot as usize]
            .as_mut()
            .expect("a live source's slot");
        if src.wait_deadline.is_some() {
            return;
        }
        let given = policy
            .wait_us(&src.name, now_us)
            .unwrap_or(config.default_timeout_us);
        let mut wait = given.clamp(-TIME_LIMIT_US, TIME_LIMIT_US);
        if src.frontier != NEVER {
            if let Some(silences) = src.silences.as_mut() {
                // a source that never delivered has shown no silences: the given wait alone
                wait = wait.max(Self::learned_wait_us(config, silences));
            }
        }
        // A source already silent for longer than its whole wait is given up at once (N sources gone together
        // cost one wait, not N in a row); any other gets the full wait from now.
        let gone = src.heard_us.is_some_and(|heard| heard + wait <= now_us)
            && config.mode == Mode::Watermark;
        src.wait_deadline = Some(if gone { now_us } else { now_us + wait });
        if src.waited_since.is_none() {
            src.waited_since = Some(now_us);
        }
    }

    fn drain<P: WaitPolicy + ?Sized>(
        &mut self,
        now_us: i64,
        policy: &mut P,
        out: &mut Vec<MergeOutput<E>>,
    ) {
        while let Some(Reverse(top)) = self.heads.peek() {
            let (ref_us, slot) = (top.time_us, top.slot);
            if let Some(blocker) = self.top_blocker(ref_us) {
                if self.blocker != Some(blocker) {
                    self.blocker = Some(blocker);
                    self.start_wait(blocker, now_us, policy);
                }
                break;
            }
            self.blocker = None;
            let src = live(&mut self.slots, slot);
            let Some(Queued {
                event,
                arrival_us,
                raised_us,
                ..
            }) = src.queue.pop_front()
            else {
                // unreachable: a heads entry names a non-empty queue; dropped rather than trusted
                self.heads.pop();
                continue;
            };
            self.queued -= 1;
            self.counters.merged += 1;
            self.released_max = self.released_max.max(ref_us);
            // never released before it arrived (frames of other connections can be handled out of read order)
            out.push(MergeOutput::Merged {
                event,
                arrival_us,
                release_us: now_us.max(arrival_us),
                ref_ts_us: ref_us,
                raised_us,
            });
            if let Some(next) = src.queue.front() {
                let next_ref = next.ref_us;
                if let Some(mut top) = self.heads.peek_mut() {
                    top.0.time_us = next_ref; // one sift instead of a pop and a push
                }
            } else {
                self.heads.pop();
                if src.leaving {
                    self.depart_promising(slot, now_us, out); // it said bye: its last queued event is out
                } else if !src.timed_out {
                    self.empty.push(Reverse(Entry {
                        time_us: src.frontier,
                        name: src.name.clone(),
                        slot,
                    }));
                }
            }
        }
        if self.empty.len() > 4 * self.by_name.len() + 64 {
            // stale entries normally surface and are dropped quickly; this bounds the worst case
            let entries: Vec<_> = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(slot, src)| {
                    let src = src.as_ref()?;
                    (src.queue.is_empty() && !src.timed_out).then(|| {
                        Reverse(Entry {
                            time_us: src.frontier,
                            name: src.name.clone(),
                            slot: slot as u32,
                        })
                    })
                })
                .collect();
            self.empty = MinHeap::from(entries);
        }
        if self.config.mode == Mode::Watermark && now_us >= self.next_punctuation_us {
            self.punctuate(now_us, out);
        }
    }

    fn punctuate(&mut self, now_us: i64, out: &mut Vec<MergeOutput<E>>) {
        // While the source that held the watermark down at the last scan is live and still at or below the emitted
        // watermark, the minimum is too and no scan is needed.
        if let Some(holder) = self.watermark_holder {
            let holder = self.src(holder);
            if !holder.timed_out && holder.bound_us() <= self.emitted_watermark {
                return;
            }
        }
        let mut low: Option<(i64, u32)> = None;
        for (slot, src) in self.slots.iter().enumerate() {
            let Some(src) = src else { continue };
            if src.timed_out {
                continue;
            }
            let bound = src.bound_us();
            if low.map_or(true, |(l, _)| bound < l) {
                low = Some((bound, slot as u32));
            }
        }
        self.watermark_holder = low.map(|(_, slot)| slot);
        let Some((low, _)) = low else { return };
        if low <= self.emitted_watermark || low < self.config.min_watermark_us {
            // below 0 a watermark promises nothing and is outside the contract's range
            return;
        }
        self.emitted_watermark = low;
        self.next_punctuation_us = now_us + self.config.punctuation_interval_us;
        self.counters.punctuations += 1;
        out.push(MergeOutput::Punctuation {
            watermark_us: low,
            at_us: now_us,
        });
    }
}

/// The live source in `slot` (borrowing the slot list only, so the merger's other fields stay free).
fn live<E>(slots: &mut [Option<Source<E>>], slot: u32) -> &mut Source<E> {
    slots[slot as usize].as_mut().expect("a live source's slot")
}

#[cfg(test)]
mod tests;
