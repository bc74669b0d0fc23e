//! The sketch against exact counts: skewed and adversarial streams, the windows, the labels.

use super::*;

const K: usize = 64;

/// How many rules' states a thread keeps a handle on.
const RECENT_RULES: usize = Recent::<Shared>::CAPACITY;

/// Exact counts of `stream`, alongside a sketch of `k` counters fed the same stream.
fn run(stream: &[u64], k: usize) -> (SpaceSaving<()>, HashMap<u64, u64>) {
    let mut sketch = SpaceSaving::new(k);
    let mut exact: HashMap<u64, u64> = HashMap::new();
    for &key in stream {
        sketch.offer(key, 1, || ());
        *exact.entry(key).or_default() += 1;
        assert!(sketch.len() <= k, "more than {k} counters");
    }
    (sketch, exact)
}

/// Space-Saving's guarantee: every key above N/k is held; held counts are upper bounds at
/// most N/k (and at most their own `error`) above the truth.
fn assert_guarantee(sketch: &SpaceSaving<()>, exact: &HashMap<u64, u64>) {
    let n = sketch.total();
    let k = sketch.capacity() as u64;
    assert_eq!(n, exact.values().sum::<u64>());
    assert!(sketch.len() <= sketch.capacity());
    for (&key, &truth) in exact {
        match sketch.get(key) {
            Some((count, error)) => {
                assert!(count >= truth, "key {key}: count {count} < true {truth}");
                assert!(
                    count - truth <= error,
                    "key {key}: over-count past its error"
                );
                assert!(error * k <= n, "key {key}: error {error} > N/k ({n}/{k})");
            }
            None => assert!(
                truth * k <= n,
                "key {key} with {truth} > N/k ({n}/{k}) is not held"
            ),
        }
    }
}

/// A Zipf(s) stream over `keys` keys, seeded.
fn zipf(n: usize, keys: usize, s: f64, seed: u64) -> Vec<u64> {
    let weights: Vec<f64> = (1..=keys).map(|r| 1.0 / (r as f64).powf(s)).collect();
    let sum: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(keys);
    let mut acc = 0.0;
    for w in weights {
        acc += w / sum;
        cdf.push(acc);
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|_| {
            let u = rng.f64();
            cdf.partition_point(|&c| c < u).min(keys - 1) as u64
        })
        .collect()
}

#[test]
fn skewed_streams_keep_the_guarantee() {
    for (s, seed) in [(0.8, 1), (1.1, 2), (1.5, 3)] {
        let stream = zipf(100_000, 20_000, s, seed);
        let (sketch, exact) = run(&stream, K);
        assert_guarantee(&sketch, &exact);
        // The heaviest keys are the ones on top, in order.
        let mut held: Vec<(u64, u64)> = sketch.entries().map(|(h, c, _, _)| (c, h)).collect();
        held.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(held[0].1, 0, "Zipf rank 1 is the top key (s = {s})");
    }
}

#[test]
fn a_heavy_key_hidden_among_many_distinct_keys_is_found() {
    // 20 000 keys seen once each; one key seen 400 times, spread evenly: 400 > N/k = 318.
    let mut rng = fastrand::Rng::with_seed(7);
    let heavy = u64::MAX;
    let mut stream: Vec<u64> = (0..20_000).collect();
    stream.extend(std::iter::repeat_n(heavy, 400));
    rng.shuffle(&mut stream);
    let (sketch, exact) = run(&stream, K);
    assert_guarantee(&sketch, &exact);
    let (count, error) = sketch.get(heavy).expect("the heavy key is held");
    assert!(count - error <= 400 && count >= 400);
    let top = sketch.entries().max_by_key(|e| e.1).unwrap();
    assert_eq!(top.0, heavy);
}

#[test]
fn an_order_built_to_evict_the_heavy_key_does_not_lose_it() {
    // Each round: the heavy key twice, then k fresh keys, each of which takes the smallest
    // counter. Heavy's 2 per round of k + 2 is above N/k, so it must survive.
    let heavy = u64::MAX;
    let mut stream = Vec::new();
    let mut fresh = 0u64;
    for _ in 0..300 {
        stream.push(heavy);
        stream.push(heavy);
        for _ in 0..K {
            stream.push(fresh);
            fresh += 1;
        }
    }
    let (sketch, exact) = run(&stream, K);
    assert_guarantee(&sketch, &exact);
    assert!(sketch.get(heavy).is_some());

    // A burst just over N/k at the start, then a flood of single keys that keeps replacing
    // the minimum: the early heavy key is still held at the end.
    let total = 40_000u64;
    let burst = total / K as u64 + 1;
    let mut stream: Vec<u64> = std::iter::repeat_n(heavy, burst as usize).collect();
    stream.extend(0..total - burst);
    let (sketch, exact) = run(&stream, K);
    assert_guarantee(&sketch, &exact);
    assert!(sketch.get(heavy).is_some());

    // Keys arriving in ascending blocks of equal counts: every counter ties, and the
    // guarantee still holds for each.
    let stream: Vec<u64> = (0..5_000u64).flat_map(|k| [k; 3]).collect();
    let (sketch, exact) = run(&stream, K);
    assert_guarantee(&sketch, &exact);
}

#[test]
fn memory_stays_at_the_bound_and_clear_reuses_it() {
    let mut sketch: SpaceSaving<()> = SpaceSaving::new(8);
    for key in 0..10_000 {
        sketch.offer(key, 1, || ());
        assert!(sketch.len() <= 8);
        assert!(sketch.indexed() <= 8);
    }
    assert_eq!(sketch.len(), 8);
    sketch.clear();
    assert!(sketch.is_empty());
    assert_eq!(sketch.total(), 0);
    assert_eq!(sketch.floor(), 0);
}

fn client(name: &str) -> Arc<Client> {
    Arc::new(Client {
        parts: vec![("ip".into(), name.into())],
    })
}

fn record(t: &mut RuleTop, now: u64, key: u64, admitted: bool) {
    let mut label = || client(&key.to_string());
    t.record(now, key, admitted, &mut label);
}

#[test]
fn windows_slide_and_merged_buckets_keep_the_guarantee() {
    let mut t = RuleTop::default();
    let t0 = 1_000_000u64;
    // Ten seconds of one limited client among noise, then quiet.
    for i in 0..1_000u64 {
        record(&mut t, t0 + i % 10, 1, false);
        record(&mut t, t0 + i % 10, 10_000 + i, false);
        record(&mut t, t0 + i % 10, 2, true);
    }
    let now = t0 + 9;
    let list = t.top(now, Window::Minute, By::Rejected, 5);
    assert_eq!(list.total, 2_000);
    assert_eq!(list.bound, 2_000 / COUNTERS as u64);
    let first = &list.clients[0];
    assert_eq!(
        first.client.parts,
        vec![("ip".to_string(), "1".to_string())]
    );
    assert!(first.count >= 1_000 && first.count - 1_000 <= list.bound);
    assert!(first.count - first.error <= 1_000);
    let admitted = t.top(now, Window::Minute, By::Admitted, 5);
    assert_eq!(admitted.clients.len(), 1);
    assert_eq!(admitted.clients[0].count, 1_000);
    assert_eq!(admitted.clients[0].error, 0);

    // A minute later it has left the minute window and is still in the hour's.
    let later = t0 + 75;
    assert!(t
        .top(later, Window::Minute, By::Rejected, 5)
        .clients
        .is_empty());
    let hour = t.top(later, Window::Hour, By::Rejected, 5);
    assert_eq!(hour.clients[0].client.parts[0].1, "1");
    // And an hour later from that too.
    assert!(t
        .top(t0 + 3_700, Window::Hour, By::Rejected, 5)
        .clients
        .is_empty());

    let (a, r) = t.series(now);
    assert_eq!(a.len(), SERIES_SECONDS);
    assert_eq!(a.iter().sum::<u64>(), 1_000);
    assert_eq!(r.iter().sum::<u64>(), 2_000);
    assert_eq!(*r.last().unwrap(), 200);
    let (_, r) = t.series(t0 + 10 + SERIES_SECONDS as u64);
    assert_eq!(
        r.iter().sum::<u64>(),
        0,
        "history older than the series is gone"
    );
}

#[test]
fn a_client_heavy_over_the_window_but_light_in_each_bucket_is_listed() {
    // Every 10-second bucket sees its own flood of distinct keys and the client a little
    // above each bucket's N_j/k: over the minute it is above N/k, so it must be listed.
    let mut t = RuleTop::default();
    let t0 = 2_000_000u64;
    let mut fresh = 0u64;
    let per_bucket = 6_400u64;
    let every = per_bucket / (per_bucket / COUNTERS as u64 + 1);
    let mut truth = 0;
    for b in 0..6u64 {
        let now = t0 + b * 10;
        for i in 0..per_bucket {
            if i % every == 0 {
                record(&mut t, now, u64::MAX, false);
                truth += 1;
            } else {
                record(&mut t, now, fresh, false);
                fresh += 1;
            }
        }
        // Heavy in each bucket by a hair, never by much.
        assert!(truth / (b + 1) * COUNTERS as u64 <= per_bucket * 11 / 10);
    }
    let list = t.top(t0 + 59, Window::Minute, By::Rejected, 1);
    let first = &list.clients[0];
    assert_eq!(first.client.parts[0].1, u64::MAX.to_string());
    assert!(first.count >= truth && first.count - truth <= list.bound);
}

/// Blocked keys: a longer block wins over a shorter one of the same key, an ended block is
/// not shown, and the list holds at most `BLOCKED_SHOWN` keys, the blocks ending first making
/// room (never a longer one for a shorter).
#[test]
fn blocked_keys_are_bounded_and_end_on_time() {
    let mut t = RuleTop::default();
    let label = |n: u64| {
        move || {
            Arc::new(Client {
                parts: vec![("ip".into(), format!("10.0.0.{n}"))],
            })
        }
    };
    t.block(100, 1, 110, &mut label(1));
    t.block(101, 1, 105, &mut label(1));
    assert_eq!(t.blocked(100)[0].1, 110, "the longer block stays");
    assert!(t.blocked(110).is_empty(), "ended at 110");
    for k in 0..(BLOCKED_SHOWN as u64 + 10) {
        t.block(100, 1000 + k, 200 + k, &mut label(k));
    }
    let shown = t.blocked(100);
    assert_eq!(shown.len(), BLOCKED_SHOWN);
    assert_eq!(shown[0].1, 200 + BLOCKED_SHOWN as u64 + 9, "longest first");
    // A block shorter than every remembered one is the one left out.
    t.block(100, 5, 150, &mut label(5));
    assert!(t.blocked(100).iter().all(|(_, end)| *end >= 200));
}

/// A config with two token-bucket rules under the given names (only those present).
fn config_with(rules: &[&str]) -> Config {
    let mut text = String::from(
        "[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9000\"]\n\n\
         [[routes]]\nname = \"r\"\nupstream = \"u\"\n",
    );
    for name in rules {
        text.push_str(&format!(
            "\n[[rules]]\nname = \"{name}\"\nkey = [\"ip\"]\nalgorithm = \"token_bucket\"\n\
             limit = 10\nwindow = \"1m\"\n"
        ));
    }
    Config::from_str(std::path::Path::new("gateway.toml"), &text).expect("valid config")
}

/// One admitted request of client `counter` under rule `name` of `cfg`, as the engine says it.
fn admitted_by(cfg: &Config, name: &str, counter: u64) -> Outcome {
    let rule = cfg.rules.iter().find(|r| &*r.name == name).expect("rule");
    Outcome {
        verdict: Verdict::Allow {
            delay: std::time::Duration::ZERO,
        },
        applied: vec![Applied {
            rule: rule.policy.clone(),
            counter,
            decision: crate::limiter::Decision::unlimited(10),
        }],
        shadow_rejected: Vec::new(),
        slots: crate::limiter::engine::Slots::default(),
        asked_store: false,
        store_call: None,
    }
}

/// What `name`'s state counted over the last minute (its one client's admitted requests).
fn counted(name: &str) -> Option<u64> {
    let state = top().rule(name)?;
    let list = state
        .lock()
        .top(top().now(), Window::Minute, By::Admitted, 10);
    assert!(list.clients.len() <= 1, "{name}: one client");
    Some(list.clients.first().map_or(0, |c| c.count))
}

/// The thread's handles on rule states are held per policy, not per name: a reload's new
/// policy of a kept rule counts into the rule's state, and a rule dropped by a reload and
/// added back by a later one starts afresh (a handle by name would keep counting into the
/// dropped state, which `/top` no longer shows).
#[test]
fn a_reload_keeps_a_kept_rules_counts_and_a_dropped_rule_starts_afresh() {
    let (kept, dropped) = ("top-reload-kept", "top-reload-dropped");
    let first = config_with(&[kept, dropped]);
    let now = Instant::now();
    let none = |_: &Applied| Client::default();
    for _ in 0..2 {
        record_labelled(&first, &admitted_by(&first, kept, 7), now, &none);
        record_labelled(&first, &admitted_by(&first, dropped, 7), now, &none);
    }
    let second = config_with(&[kept]);
    top().retain_rules(&second);
    assert!(
        top().rule(dropped).is_none(),
        "the dropped rule's state is gone"
    );
    record_labelled(&second, &admitted_by(&second, kept, 7), now, &none);
    assert_eq!(
        counted(kept),
        Some(3),
        "the kept rule counts on across the reload"
    );

    let third = config_with(&[kept, dropped]);
    top().retain_rules(&third);
    record_labelled(&third, &admitted_by(&third, dropped, 7), now, &none);
    assert_eq!(counted(dropped), Some(1), "the re-added rule starts afresh");
}

/// A config with more rules than a thread keeps handles on: every rule still counts into its
/// own state, and the thread holds no more than its bound of handles (and of old policies).
#[test]
fn more_rules_than_a_thread_keeps_handles_on_each_count_their_own() {
    let names: Vec<String> = (0..3 * RECENT_RULES)
        .map(|i| format!("top-many-{i}"))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let cfg = config_with(&names);
    let now = Instant::now();
    let none = |_: &Applied| Client::default();
    for round in 1..=2 {
        for name in &names {
            record_labelled(&cfg, &admitted_by(&cfg, name, 9), now, &none);
            let held = RECENT.with(|r| r.borrow().len());
            assert!(held <= RECENT_RULES, "{held} handles held");
        }
        for name in &names {
            assert_eq!(counted(name), Some(round), "{name} after round {round}");
        }
    }
}
