//! Hand-computed cases (the ones of tests/unit/reorder/test_reorder_sequence.py and test_reorder_timeout_policy.py, which
//! the Python core passes too); the differential tests cover the rest against the Python core.

use super::*;

type R = SequenceReorderer<i128>;

fn cfg(initial_seq: i128) -> SequenceConfig {
    SequenceConfig {
        initial_seq: Some(initial_seq),
        ..SequenceConfig::default()
    }
}

fn push(r: &mut R, seq: i128, now: i128) -> Vec<Output<i128>> {
    let mut out = Vec::new();
    r.push(seq, seq, now, &mut out);
    out
}

fn advance(r: &mut R, now: i128) -> Vec<Output<i128>> {
    let mut out = Vec::new();
    r.advance(now, &mut out);
    out
}

fn released(out: &[Output<i128>]) -> Vec<i128> {
    out.iter()
        .filter_map(|o| {
            if let Output::Released { seq, .. } = o {
                Some(*seq)
            } else {
                None
            }
        })
        .collect()
}

fn rel(seq: i128, arrival_us: i128, release_us: i128, late: bool) -> Output<i128> {
    Output::Released {
        payload: seq,
        seq,
        arrival_us,
        release_us,
        late,
    }
}

fn late(
    seq: i128,
    arrival_us: i128,
    reason: LateReason,
    lateness_us: i128,
    passed: bool,
) -> Output<i128> {
    Output::Late {
        payload: seq,
        seq,
        arrival_us,
        reason,
        lateness_us,
        passed,
    }
}

/// A duplicate: reported, never released.
fn duplicate(seq: i128, at_us: i128) -> Vec<Output<i128>> {
    vec![late(seq, at_us, LateReason::Duplicate, 0, false)]
}

/// A late event the configuration passes on: reported late, then released as it arrives.
fn passed(seq: i128, at_us: i128, reason: LateReason, lateness_us: i128) -> Vec<Output<i128>> {
    vec![
        late(seq, at_us, reason, lateness_us, true),
        rel(seq, at_us, at_us, true),
    ]
}

#[test]
fn thesis_example_e1_e2_e4_e5_e6_e3_e7() {
    let mut r = R::new(cfg(1)).unwrap();
    let steps: Vec<Vec<i128>> = [1, 2, 4, 5, 6, 3, 7]
        .iter()
        .enumerate()
        .map(|(i, &s)| released(&push(&mut r, s, 10 * i as i128)))
        .collect();
    assert_eq!(
        steps,
        vec![
            vec![1],
            vec![2],
            vec![],
            vec![],
            vec![],
            vec![3, 4, 5, 6],
            vec![7]
        ]
    );
    assert_eq!(r.counters.peak_buffered, 3);
    assert_eq!(r.counters.timeouts, 0);
    assert_eq!(r.next_deadline_us(), None);
}

/// A thesis-mode reorderer with threshold `latency_threshold_us` that released seqs 1..3 in order at 0, 100 and
/// 300 us: inter-arrival samples 100 and 200, so `max(t_inter, t_buffer)` = 140 + 2 x 100 = 340 (Eq. 3.1-3.5).
fn thesis_after_three(latency_threshold_us: i128) -> R {
    let mut r = R::new(SequenceConfig {
        initial_seq: Some(1),
        ..SequenceConfig::thesis(latency_threshold_us)
    })
    .unwrap();
    for (seq, t) in [(1, 0), (2, 100), (3, 300)] {
        push(&mut r, seq, t);
    }
    r
}

#[test]
fn eq_3_11_timeout_is_min_of_threshold_and_max_of_both() {
    assert_eq!(thesis_after_three(300).timeout_us(), 300); // capped by t_latency-th
    assert_eq!(thesis_after_three(10_000).timeout_us(), 340);
}

#[test]
fn thesis_timeout_skips_the_gap_and_the_late_event_passes_flagged() {
    let mut r = thesis_after_three(500);
    assert_eq!(push(&mut r, 5, 400), vec![]); // timeout 340 -> deadline 740
    assert_eq!(r.next_deadline_us(), Some(740));
    assert_eq!(advance(&mut r, 739), vec![]);
    assert_eq!(
        advance(&mut r, 800),
        vec![
            Output::GapSkipped {
                first_seq: 4,
                last_seq: 4,
                waited_us: 340,
                at_us: 740,
                reason: GapReason::Timeout
            },
            rel(5, 400, 740, false),
        ]
    );
    assert_eq!(
        push(&mut r, 4, 800),
        passed(4, 800, LateReason::LateAfterSkip, 60)
    );
    assert_eq!(push(&mut r, 4, 900), duplicate(4, 900));
    assert_eq!(
        (r.counters.late, r.counters.duplicates, r.counters.timeouts),
        (1, 1, 1)
    );
}

#[test]
fn drop_late_sends_a_late_event_to_the_side_output_only() {
    let mut r = R::new(SequenceConfig {
        drop_late: true,
        latency_threshold_us: 100,
        ..cfg(1)
    })
    .unwrap();
    push(&mut r, 2, 0);
    advance(&mut r, 100);
    assert_eq!(
        push(&mut r, 1, 150),
        vec![late(1, 150, LateReason::LateAfterSkip, 50, false)]
    );
}

#[test]
fn adaptive_timeout_is_the_factor_times_the_quantile_and_learns_from_late_arrivals() {
    let c = SequenceConfig {
        latency_threshold_us: 1_000_000,
        min_gap_samples: 3,
        warmup_min_timeout_us: 0,
        ..cfg(0)
    };
    let mut r = R::new(c).unwrap();
    let (mut t, mut seq) = (0, 0);
    for _ in 0..3 {
        push(&mut r, seq + 1, t);
        push(&mut r, seq, t + 100);
        seq += 2;
        t += 1000;
    }
    assert_eq!(r.timeout_us(), 2 * 104);
    push(&mut r, seq + 1, t);
    advance(&mut r, t + 300);
    push(&mut r, seq, t + 50_000);
    assert!(r.timeout_us() >= 50_000);
    assert_eq!(r.counters.late, 1);
}

#[test]
fn the_quantile_is_trusted_from_the_200th_sample_and_the_warmup_floor_holds_until_10000() {
    for (floor, expect) in [(0, 2 * 1_021), (100_000, 100_000)] {
        let mut r = R::new(SequenceConfig {
            warmup_min_timeout_us: floor,
            ..SequenceConfig::default()
        })
        .unwrap();
        let mut timeouts = Vec::new();
        for k in 0..200 {
            push(&mut r, 2 * k + 1, 10_000 * k);
            push(&mut r, 2 * k, 10_000 * k + 1_000);
            timeouts.push(r.timeout_us());
        }
        assert!(timeouts[..199].iter().all(|&t| t == 2_000_000));
        assert_eq!(timeouts[199], expect);
    }
    assert_eq!(warmup_samples_for(0.9999), 10_000);
    assert_eq!(warmup_samples_for(0.99), 100);
    assert_eq!(warmup_samples_for(0.5), 2);
    assert_eq!(warmup_samples_for(0.1), 2); // ceil(1.111111)
}

#[test]
fn buffer_full_skips_the_head_gap() {
    let mut r = R::new(SequenceConfig {
        max_buffered: 3,
        ..cfg(0)
    })
    .unwrap();
    for seq in 1..=3 {
        assert_eq!(push(&mut r, seq, seq), vec![]);
    }
    let out = push(&mut r, 4, 4);
    assert_eq!(
        out[0],
        Output::GapSkipped {
            first_seq: 0,
            last_seq: 0,
            waited_us: 3,
            at_us: 4,
            reason: GapReason::BufferFull
        }
    );
    assert_eq!(released(&out), vec![1, 2, 3, 4]);
    assert_eq!(r.counters.buffer_full_skips, 1);
}

#[test]
fn flush_releases_everything_in_seq_order() {
    let mut r = R::new(SequenceConfig::default()).unwrap();
    for seq in [5, 3, 8] {
        push(&mut r, seq, 0);
    }
    let mut out = Vec::new();
    r.flush(10, &mut out);
    assert_eq!(released(&out), vec![3, 5, 8]);
    let firsts: Vec<i128> = out
        .iter()
        .filter_map(|o| {
            if let Output::GapSkipped { first_seq, .. } = o {
                Some(*first_seq)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(firsts, vec![0, 4, 6]);
}

#[test]
fn initial_seq_none_adopts_the_first_event() {
    let mut r = R::new(SequenceConfig {
        initial_seq: None,
        ..SequenceConfig::default()
    })
    .unwrap();
    assert_eq!(released(&push(&mut r, 1000, 0)), vec![1000]);
    assert_eq!(released(&push(&mut r, 1002, 1)), Vec::<i128>::new());
    assert_eq!(released(&push(&mut r, 1001, 2)), vec![1001, 1002]);
    assert_eq!(
        push(&mut r, 999, 3),
        passed(999, 3, LateReason::BeforeStart, 0)
    );
    assert_eq!(push(&mut r, 1001, 4), duplicate(1001, 4));
}

#[test]
fn a_seq_jump_is_one_range_and_the_newest_skipped_seqs_tell_late_from_duplicate() {
    let mut r = R::new(SequenceConfig {
        max_buffered: 100_000,
        ..cfg(0)
    })
    .unwrap();
    push(&mut r, 0, 0);
    push(&mut r, 1_000_000, 10);
    assert_eq!(r.holes_tracked(), (100_000, 1)); // only max_buffered seqs back are tracked, in one range
    let due = r.next_deadline_us().unwrap();
    let out = advance(&mut r, due);
    assert_eq!(
        out[0],
        Output::GapSkipped {
            first_seq: 1,
            last_seq: 999_999,
            waited_us: 2_000_000,
            at_us: due,
            reason: GapReason::Timeout
        }
    );
    assert_eq!(r.skipped_tracked(), (100_000, 1));
    let reasons = |out: Vec<Output<i128>>| -> Vec<LateReason> {
        out.into_iter()
            .filter_map(|o| {
                if let Output::Late { reason, .. } = o {
                    Some(reason)
                } else {
                    None
                }
            })
            .collect()
    };
    assert_eq!(
        reasons(push(&mut r, 999_999, 3_000_000)),
        vec![LateReason::LateAfterSkip]
    );
    assert_eq!(
        reasons(push(&mut r, 5, 3_000_001)),
        vec![LateReason::Duplicate]
    );
}

#[test]
fn skipped_seqs_are_capped_at_1024_ranges() {
    let mut r = R::new(SequenceConfig {
        max_buffered: 1,
        ..cfg(0)
    })
    .unwrap();
    let mut now = 0;
    for k in 0..3000 {
        now += 10;
        push(&mut r, 2 * k + 1, now);
    }
    assert_eq!(
        (r.counters.skipped_seqs, r.counters.buffer_full_skips),
        (2999, 2999)
    );
    assert_eq!(r.skipped_tracked(), (1024, 1024));
    let reason = |out: Vec<Output<i128>>| match out.first() {
        Some(Output::Late { reason, .. }) => Some(*reason),
        _ => None,
    };
    assert_eq!(
        reason(push(&mut r, 3950, now + 1)),
        Some(LateReason::LateAfterSkip)
    );
    assert_eq!(
        reason(push(&mut r, 5996, now + 2)),
        Some(LateReason::LateAfterSkip)
    );
    assert_eq!(
        reason(push(&mut r, 3948, now + 3)),
        Some(LateReason::Duplicate)
    );
}

#[test]
fn take_in_order_is_the_fast_path_only() {
    let mut r = R::new(cfg(0)).unwrap();
    assert!(r.take_in_order(0, 5));
    assert!(!r.take_in_order(2, 6));
    push(&mut r, 2, 6);
    assert!(!r.take_in_order(1, 7)); // something is buffered: push's path
    assert_eq!(
        (r.expected_seq(), r.counters.in_order, r.counters.released),
        (1, 1, 1)
    );
}

#[test]
fn the_largest_contract_seq_and_times_do_not_overflow() {
    let max_seq = i128::from(i64::MAX);
    let mut r = R::new(SequenceConfig {
        initial_seq: Some(max_seq - 1),
        ..SequenceConfig::default()
    })
    .unwrap();
    push(&mut r, max_seq, 1 << 62);
    assert_eq!(r.next_deadline_us(), Some((1 << 62) + 2_000_000));
    assert_eq!(
        released(&push(&mut r, max_seq - 1, 1 << 62)),
        vec![max_seq - 1, max_seq]
    );
    assert_eq!(r.expected_seq(), max_seq + 1);
}

#[test]
fn bad_configs_are_refused() {
    let bad = [
        SequenceConfig {
            latency_threshold_us: -1,
            ..SequenceConfig::default()
        },
        SequenceConfig {
            target_accuracy: 1.0,
            ..SequenceConfig::default()
        },
        SequenceConfig {
            target_accuracy: f64::NAN,
            ..SequenceConfig::default()
        },
        SequenceConfig {
            max_buffered: 0,
            ..SequenceConfig::default()
        },
        SequenceConfig {
            alpha: 1.5,
            ..SequenceConfig::default()
        },
        SequenceConfig {
            quantile_half_life: 0.0,
            ..SequenceConfig::default()
        },
        SequenceConfig {
            quantile_half_life: 1e-5,
            ..SequenceConfig::default()
        },
        SequenceConfig {
            timeout_factor: f64::INFINITY,
            ..SequenceConfig::default()
        },
        SequenceConfig {
            max_skipped_tracked: -1,
            ..SequenceConfig::default()
        },
    ];
    for c in bad {
        assert!(R::new(c.clone()).is_err(), "{c:?}");
    }
}

#[test]
fn the_adaptive_cap_learns_twice_the_longest_gap_delay_and_never_shrinks() {
    let c = SequenceConfig {
        latency_threshold_us: 1_000,
        max_latency_threshold_us: 5_000,
        ..cfg(0)
    };
    let mut r = R::new(c).unwrap();
    assert_eq!(r.effective_latency_threshold_us(), 1_000);
    push(&mut r, 1, 0);
    push(&mut r, 0, 800); // a gap closed after 800 us: the cap is 2 x 800
    assert_eq!(
        (r.longest_gap_delay_us(), r.effective_latency_threshold_us()),
        (800, 1_600)
    );
    assert_eq!(r.timeout_us(), 1_600); // fewer than min_gap_samples: the cap itself
    push(&mut r, 3, 1_000);
    push(&mut r, 2, 1_010); // a shorter one changes nothing
    assert_eq!(r.effective_latency_threshold_us(), 1_600);
    push(&mut r, 5, 2_000);
    advance(&mut r, 2_000 + 1_600);
    push(&mut r, 4, 2_000 + 9_000); // late after its skip: 9 ms, capped at max_latency_threshold_us
    assert_eq!(
        (r.longest_gap_delay_us(), r.effective_latency_threshold_us()),
        (9_000, 5_000)
    );
    let thesis = R::new(SequenceConfig {
        initial_seq: Some(0),
        ..SequenceConfig::thesis(300)
    })
    .unwrap();
    assert_eq!(thesis.effective_latency_threshold_us(), 300);
}
