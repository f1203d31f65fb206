//! Hand-computed cases (most from tests/unit/reorder/test_reorder_merger.py, the Python core's suite); the differential
//! property tests in tests/unit/native/test_native_merger.py compare everything else with the Python core.

use super::*;

/// An event handle: (source, seq).
type Ev = (&'static str, i64);
type M = MultiSourceMerger<Ev>;
type Out = Vec<MergeOutput<Ev>>;

fn merger(config: MergerConfig) -> M {
    MultiSourceMerger::new(config).expect("a valid config")
}

fn no_learning() -> MergerConfig {
    MergerConfig {
        learn_wait: false,
        ..MergerConfig::default()
    }
}

/// `push` mapped with offset `offset_us` and bound `error_us`, arriving at `now_us`.
fn push_mapped(
    m: &mut M,
    source: &'static str,
    seq: i64,
    ref_us: i64,
    error_us: i64,
    now_us: i64,
) -> Out {
    let mut out = Vec::new();
    m.push(
        source,
        seq,
        (source, seq),
        now_us,
        now_us,
        false,
        (ref_us, error_us),
        &mut DefaultWait,
        &mut out,
    )
    .expect("in range");
    out
}

fn push(m: &mut M, source: &'static str, seq: i64, ref_us: i64, now_us: i64) -> Out {
    push_mapped(m, source, seq, ref_us, 0, now_us)
}

fn register(m: &mut M, source: &str, now_us: i64) -> Out {
    let mut out = Vec::new();
    m.register(source, now_us, &mut DefaultWait, &mut out)
        .expect("in range");
    out
}

fn heartbeat(m: &mut M, source: &str, seq: i64, ref_us: i64, now_us: i64, caught_up: bool) -> Out {
    let mut out = Vec::new();
    m.heartbeat(
        source,
        seq,
        now_us,
        caught_up,
        (ref_us, 0),
        &mut DefaultWait,
        &mut out,
    )
    .expect("in range");
    out
}

fn advance(m: &mut M, now_us: i64) -> Out {
    let mut out = Vec::new();
    m.advance(now_us, &mut DefaultWait, &mut out)
        .expect("in range");
    out
}

fn leave(m: &mut M, source: &str, now_us: i64) -> Out {
    let mut out = Vec::new();
    m.leave(source, now_us, &mut DefaultWait, &mut out)
        .expect("in range");
    out
}

/// The released events as (source, seq, ref_ts_us).
fn merged(out: &Out) -> Vec<(&'static str, i64, i64)> {
    out.iter()
        .filter_map(|o| match o {
            MergeOutput::Merged {
                event, ref_ts_us, ..
            } => Some((event.0, event.1, *ref_ts_us)),
            _ => None,
        })
        .collect()
}

fn watermarks(out: &Out) -> Vec<i64> {
    out.iter()
        .filter_map(|o| match o {
            MergeOutput::Punctuation { watermark_us, .. } => Some(*watermark_us),
            _ => None,
        })
        .collect()
}

fn timed_out(out: &Out) -> Vec<String> {
    out.iter()
        .filter_map(|o| match o {
            MergeOutput::SourceTimedOut { source_id, .. } => Some(source_id.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn thesis_releases_the_smallest_reference_time_with_each_sources_offset() {
    // S2's clock 1000 us behind the reference, S3's 500 us ahead: the refs below are ts + offset
    let mut m = merger(MergerConfig {
        mode: Mode::Thesis,
        default_timeout_us: 10_000,
        ..MergerConfig::default()
    });
    for s in ["S1", "S2", "S3"] {
        register(&mut m, s, 0);
    }
    let mut out = push(&mut m, "S1", 0, 1200, 1);
    out.extend(push(&mut m, "S2", 0, 1000, 2));
    assert_eq!(merged(&out), []);
    assert_eq!(merged(&push(&mut m, "S3", 0, 1100, 3)), [("S2", 0, 1000)]);
    assert_eq!(merged(&push(&mut m, "S2", 1, 1300, 4)), [("S3", 0, 1100)]);
    assert_eq!(merged(&push(&mut m, "S3", 1, 1400, 5)), [("S1", 0, 1200)]);
    assert_eq!(m.next_deadline_us(), Some(5 + 10_000));
}

#[test]
fn sources_gone_silent_together_cost_the_merge_one_wait() {
    let mut m = merger(MergerConfig {
        default_timeout_us: 1_000_000,
        ..no_learning()
    });
    let gone = ["g0", "g1", "g2"];
    for s in gone {
        register(&mut m, s, 0);
    }
    let mut out = Vec::new();
    for s in gone {
        out.extend(push(&mut m, s, 0, 100, 10));
    }
    assert_eq!(
        merged(&out),
        [("g0", 0, 100), ("g1", 0, 100), ("g2", 0, 100)]
    );
    register(&mut m, "new", 5_000_000);
    assert_eq!(merged(&push(&mut m, "new", 0, 5_000_000, 5_000_000)), []);
    // silent for 5 s, more than their 1 s wait: given up at once, all three in the one advance
    assert_eq!(m.next_deadline_us(), Some(5_000_000));
    let out = advance(&mut m, 5_000_000);
    assert_eq!(timed_out(&out), ["g0", "g1", "g2"]);
    assert_eq!(merged(&out), [("new", 0, 5_000_000)]);
    assert_eq!(m.counters().timeouts, 3);
}

#[test]
fn an_empty_source_whose_frontier_is_ahead_holds_nothing_and_a_heartbeat_releases() {
    let mut m = merger(MergerConfig {
        default_timeout_us: 1000,
        punctuation_interval_us: 0,
        ..MergerConfig::default()
    });
    heartbeat(&mut m, "A", -1, 0, 0, false);
    heartbeat(&mut m, "B", -1, 0, 0, false);
    assert_eq!(merged(&push(&mut m, "B", 0, 50, 60)), []); // A may still send 1..49
    assert_eq!(merged(&push(&mut m, "A", 0, 40, 70)), [("A", 0, 40)]);
    let out = heartbeat(&mut m, "A", 0, 55, 80, false); // nothing older than 55 will come from A
    assert_eq!(merged(&out), [("B", 0, 50)]);
    assert_eq!(watermarks(&out), [50]);
    assert_eq!(
        (m.is_timed_out("A"), m.next_deadline_us()),
        (Some(false), None)
    );
}

#[test]
fn a_heartbeat_counts_only_once_every_event_up_to_its_seq_was_delivered() {
    let mut m = merger(MergerConfig {
        default_timeout_us: 1000,
        ..MergerConfig::default()
    });
    heartbeat(&mut m, "A", -1, 0, 0, false);
    push(&mut m, "B", 0, 50, 1);
    assert_eq!(merged(&heartbeat(&mut m, "A", 3, 100, 2, false)), []);
    assert_eq!(
        merged(&push(&mut m, "A", 3, 30, 3)),
        [("A", 3, 30), ("B", 0, 50)]
    );
}

#[test]
fn a_timed_out_source_back_below_the_punctuation_goes_late_by_how_far_it_is_behind() {
    let mut m = merger(MergerConfig {
        default_timeout_us: 100,
        punctuation_interval_us: 0,
        ..no_learning()
    });
    heartbeat(&mut m, "A", -1, 0, 0, false);
    heartbeat(&mut m, "B", -1, 0, 0, false);
    push(&mut m, "A", 0, 500, 10);
    let out = advance(&mut m, 110);
    assert_eq!(timed_out(&out), ["B"]);
    assert_eq!(merged(&out), [("A", 0, 500)]);
    push(&mut m, "A", 1, 600, 120);
    assert_eq!(m.watermark_us(), Some(600));
    let out = push(&mut m, "B", 0, 200, 130);
    let late = MergeOutput::Late {
        event: ("B", 0),
        arrival_us: 130,
        reason: LateReason::AfterPunctuation,
        lateness_us: 400,
    };
    assert_eq!(out, [late]);
    assert_eq!(m.counters().late, 1);
}

fn learning() -> MergerConfig {
    MergerConfig {
        default_timeout_us: 10,
        punctuation_interval_us: 0,
        learned_wait_cap_us: 5_000,
        min_wait_samples: 3,
        ..MergerConfig::default()
    }
}

#[test]
fn before_it_has_seen_enough_silences_the_merge_waits_the_cap() {
    let mut m = merger(learning());
    heartbeat(&mut m, "a", -1, 0, 0, false);
    heartbeat(&mut m, "b", -1, 0, 0, false);
    assert_eq!(merged(&push(&mut m, "a", 0, 100, 100)), []);
    assert_eq!(m.next_deadline_us(), Some(100 + 5_000));
    // b's uplink stalled 3 ms: the wait outlasts it, nothing is diverted
    assert_eq!(
        merged(&push(&mut m, "b", 0, 100, 3_100)),
        [("a", 0, 100), ("b", 0, 100)]
    );
    assert_eq!(m.counters().timeouts, 0);
}

#[test]
fn once_trusted_the_learned_wait_is_twice_the_quantile_of_the_sources_silences() {
    let mut m = merger(learning());
    heartbeat(&mut m, "a", -1, 0, 0, false);
    heartbeat(&mut m, "b", -1, 0, 0, false);
    for k in 1..4 {
        // a's event at 1000 k starts a wait for b, which speaks 30 us later
        push(&mut m, "a", 1_000 * k, 1_000 * k, 1_000 * k);
        assert_eq!(
            merged(&push(&mut m, "b", 1_000 * k, 1_000 * k, 1_000 * k + 30)).len(),
            2
        );
    }
    push(&mut m, "a", 4_000, 3_050, 3_050);
    // 30 us falls in the bucket whose upper edge is 31 us (ceil(1.05^70)): the wait is 2 x 31, above the given 10
    assert_eq!(m.next_deadline_us(), Some(3_050 + 62));
}

#[test]
fn a_departure_gives_an_empty_source_up_at_once_without_a_timeout() {
    let mut m = merger(MergerConfig {
        default_timeout_us: 1_000_000_000,
        ..no_learning()
    });
    register(&mut m, "A", 0);
    register(&mut m, "B", 0);
    assert_eq!(merged(&push(&mut m, "A", 0, 10, 10)), []);
    let out = leave(&mut m, "B", 11);
    assert_eq!(merged(&out), [("A", 0, 10)]);
    assert_eq!(timed_out(&out), Vec::<String>::new());
    assert_eq!(m.is_timed_out("B"), Some(true));
    assert_eq!((m.counters().departures, m.counters().timeouts), (1, 0));
    assert_eq!(m.next_deadline_us(), None);
    assert_eq!(leave(&mut m, "B", 12), []);
}

#[test]
fn the_last_departure_punctuates_what_the_last_heartbeat_promised() {
    let mut m = merger(MergerConfig {
        punctuation_interval_us: 1_000_000_000,
        ..no_learning()
    });
    register(&mut m, "A", 0);
    register(&mut m, "B", 0);
    let mut out = push(&mut m, "A", 0, 7_000, 10);
    out.extend(push(&mut m, "B", 0, 7_500, 11));
    out.extend(heartbeat(&mut m, "A", 0, 8_100, 12, true));
    out.extend(heartbeat(&mut m, "B", 0, 8_000, 13, true));
    out.extend(leave(&mut m, "A", 14));
    out.extend(leave(&mut m, "B", 15));
    assert_eq!(merged(&out), [("A", 0, 7_000), ("B", 0, 7_500)]);
    assert_eq!(watermarks(&out).last(), Some(&8_000));
}

#[test]
fn a_frontier_keeps_the_bound_of_the_mapping_that_set_it() {
    let mut m = merger(MergerConfig {
        punctuation_interval_us: 0,
        ..no_learning()
    });
    register(&mut m, "A", 0);
    let mut out = push_mapped(&mut m, "A", 0, 100, 10, 1);
    let mut beat = Vec::new();
    m.heartbeat("A", 0, 2, false, (1_000, 500), &mut DefaultWait, &mut beat)
        .unwrap();
    out.extend(beat);
    out.extend(push_mapped(&mut m, "A", 1, 600, 100, 3)); // 400 below the frontier: within 500 + 100
    out.extend(push_mapped(&mut m, "A", 2, 399, 100, 4)); // 601 below: beyond both
    assert_eq!(merged(&out), [("A", 0, 100), ("A", 1, 600)]);
    let late: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            MergeOutput::Late {
                event,
                reason,
                lateness_us,
                ..
            } => Some((event.1, *reason, *lateness_us)),
            _ => None,
        })
        .collect();
    assert_eq!(late, [(2, LateReason::StampRegression, 601)]);
    assert_eq!(watermarks(&out), [90, 500, 900]);
}

#[test]
fn a_regression_within_the_bound_is_raised_to_what_was_released() {
    let mut m = merger(MergerConfig {
        punctuation_interval_us: 1_000_000,
        ..no_learning()
    });
    register(&mut m, "A", 0);
    register(&mut m, "B", 0);
    heartbeat(&mut m, "B", -1, 10_000, 0, false);
    push_mapped(&mut m, "A", 0, 500, 0, 1); // released; punctuation 500 - 0 at now 1
    let out = push_mapped(&mut m, "A", 1, 480, 30, 2); // 20 below the release, within its 30: raised to 500
    assert_eq!(out.len(), 1);
    match &out[0] {
        MergeOutput::Merged {
            ref_ts_us,
            raised_us,
            ..
        } => assert_eq!((*ref_ts_us, *raised_us), (500, 20)),
        other => panic!("not merged: {other:?}"),
    }
    assert_eq!(m.counters().raised, 1);
}

#[test]
fn a_source_over_its_queue_limit_gives_up_the_source_the_merge_waits_for() {
    let mut m = merger(MergerConfig {
        max_queued_per_source: 2,
        default_timeout_us: 1_000_000,
        ..no_learning()
    });
    register(&mut m, "A", 0);
    register(&mut m, "B", 0);
    push(&mut m, "A", 0, 10, 1);
    push(&mut m, "A", 1, 20, 2);
    assert_eq!(m.queued(), 2);
    let out = push(&mut m, "A", 2, 30, 3); // a third queued event: B is given up at once
    assert_eq!(timed_out(&out), ["B"]);
    assert_eq!(merged(&out).len(), 3);
    assert_eq!(m.counters().peak_queued, 3);
}

#[test]
fn a_run_releases_what_pushes_one_by_one_release() {
    let config = MergerConfig {
        punctuation_interval_us: 0,
        ..no_learning()
    };
    let (mut one, mut run) = (merger(config.clone()), merger(config));
    for m in [&mut one, &mut run] {
        register(m, "A", 0);
        register(m, "B", 0);
        heartbeat(m, "B", -1, 25, 0, false);
    }
    let events = [(0, 10), (1, 20), (2, 30), (3, 5)]; // the last goes backwards by 25: a stamp regression
    let mut by_one = Vec::new();
    for (seq, ref_us) in events {
        by_one.extend(push(&mut one, "A", seq, ref_us, 7));
    }
    let items = events
        .iter()
        .map(|&(seq, ref_us)| RunEvent {
            seq,
            event: ("A", seq),
            arrival_us: 7,
            ref_us,
            error_us: 0,
        })
        .collect();
    let mut by_run = Vec::new();
    run.push_run("A", items, 7, &mut DefaultWait, &mut by_run)
        .unwrap();
    assert_eq!(merged(&by_run), merged(&by_one));
    assert_eq!(merged(&by_run), [("A", 0, 10), ("A", 1, 20)]);
    assert_eq!(
        (
            run.counters().stamp_regressions,
            one.counters().stamp_regressions
        ),
        (1, 1)
    );
    // the run punctuates once, after its releases (25: B's frontier); one by one, after each (10, 20, 25)
    assert_eq!(
        (run.counters().punctuations, one.counters().punctuations),
        (1, 3)
    );
}

#[test]
fn forgetting_is_refused_for_the_awaited_source_and_compaction_keeps_registration_order() {
    let mut m = merger(MergerConfig {
        default_timeout_us: 1_000,
        ..no_learning()
    });
    register(&mut m, "A", 0);
    register(&mut m, "B", 0);
    push(&mut m, "A", 0, 10, 10);
    push(&mut m, "B", 0, 20, 20);
    assert!(m.waits_for("A"));
    assert!(!m.forget("A"));
    let names: Vec<String> = (0..100).map(|i| format!("idle{i:03}")).collect();
    for name in &names {
        heartbeat(&mut m, name, -1, 1_000_000, 30, false); // far ahead: none of them holds B's event back
    }
    for name in names.iter().take(90) {
        assert!(m.forget(name));
    }
    let expected: Vec<&str> = ["A", "B"]
        .into_iter()
        .chain(names[90..].iter().map(String::as_str))
        .collect();
    assert_eq!(m.sources().collect::<Vec<_>>(), expected);
    let out = advance(&mut m, 1_020);
    assert_eq!(timed_out(&out), ["A"]);
    assert_eq!(merged(&out), [("B", 0, 20)]);
    assert_eq!((m.next_deadline_us(), m.queued()), (None, 0));
}

#[test]
fn bad_input_is_refused_before_anything_changes() {
    let mut m = merger(MergerConfig::default());
    let mut out = Vec::new();
    let err = m
        .push(
            "a",
            0,
            ("a", 0),
            0,
            0,
            false,
            (1 << 62, 0),
            &mut DefaultWait,
            &mut out,
        )
        .unwrap_err();
    assert_eq!(
        err,
        MergeError::OutOfRange {
            what: "ref_us",
            value: 1 << 62
        }
    );
    let err = m
        .heartbeat("a", 0, 0, false, (0, -1), &mut DefaultWait, &mut out)
        .unwrap_err();
    assert_eq!(err.to_string(), "merger: error_us -1 is outside [0, 2^61]");
    assert!(m.advance(i64::MIN, &mut DefaultWait, &mut out).is_err());
    assert_eq!(
        (m.sources().count(), m.counters().heartbeats, out.len()),
        (0, 0, 0)
    );
    let bad = MergerConfig {
        wait_quantile: 1.0,
        ..MergerConfig::default()
    };
    assert_eq!(
        MultiSourceMerger::<Ev>::new(bad).err(),
        Some(MergeError::Config("wait_quantile must be in (0, 1)"))
    );
}
