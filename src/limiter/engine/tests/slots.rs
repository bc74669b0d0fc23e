//! Concurrency slots: what a request holds, and under which holder id it gives them back.

use std::sync::Arc;

use super::fake::Fake;
use super::*;
use crate::limiter::store::StoreError;

#[tokio::test]
async fn a_partial_admit_rejects_keeps_no_slot_and_leaves_rate_units_charged() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-part-rate"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"

[[rules]]
name = "eng-part-conc"
key = ["ip"]
algorithm = "concurrency"
limit = 10

[[rules]]
name = "eng-part-tight"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
status = 403

[[rules]]
name = "eng-part-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 2
window = "1m"
scope = "local"
"#,
    );
    let (fake, mut released) = Fake::new();
    let limiter = limiter(&fake);
    let first = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&first), "{:?}", first.verdict);
    assert_eq!(fake.held("eng-part-conc"), 1);

    // The tight rule's step rejects while the other steps admitted.
    let second = limiter.decide(applying(&cfg), &cfg.store).await;
    match &second.verdict {
        Verdict::Reject { status, rules, .. } => {
            assert_eq!(*status, 403, "the rejecting rule's status");
            assert_eq!(rules, &[Arc::<str>::from("eng-part-tight")]);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert!(second.slots.is_empty(), "a rejected request holds no slot");
    // The headers show what each rule said, the admitting ones included.
    let said: Vec<bool> = second.applied.iter().map(|a| a.decision.allowed).collect();
    assert_eq!(said, [true, true, false, true]);
    assert_eq!(
        fake.charged("eng-part-rate"),
        2,
        "the admitting rate step stays charged"
    );
    assert_eq!(
        fake.held("eng-part-conc"),
        1,
        "only the first request's slot is held"
    );
    assert_eq!(rule(&cfg, "eng-part-tight").counters.rejected.get(), 1);

    // No rule was charged in process for the rejected request: the local rule (limit 2)
    // admits once more.
    fake.fail(Some(StoreError::Timeout));
    let third = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(
        admitted(&third),
        "local rule still has room: {:?}",
        third.verdict
    );

    // Only the first request's slots are ever released, when its outcome goes.
    drop((second, third));
    drop(first);
    let (rules, holder) = released.recv().await.expect("released");
    assert_eq!(holder, fake.holders.lock()[0]);
    assert_eq!(rules, [Arc::<str>::from("eng-part-conc")]);
    assert_eq!(fake.held("eng-part-conc"), 0);
}

#[tokio::test]
async fn an_admitted_request_releases_its_shared_slots_under_its_holder() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-holder-conc"
key = ["ip"]
algorithm = "concurrency"
limit = 1

[[rules]]
name = "eng-holder-rate"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"
"#,
    );
    let (fake, mut released) = Fake::new();
    let limiter = limiter(&fake);
    let first = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&first));
    let busy = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(!admitted(&busy), "the one shared slot is held");
    drop(busy);

    drop(first);
    let (rules, holder) = released.recv().await.expect("released");
    assert_eq!(
        holder,
        fake.holders.lock()[0],
        "released under the holder it was taken with"
    );
    assert_eq!(
        rules,
        [Arc::<str>::from("eng-holder-conc")],
        "only concurrency checks hold anything"
    );
    let again = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(
        admitted(&again),
        "the slot is free again: {:?}",
        again.verdict
    );
    let holders = fake.holders.lock().clone();
    assert_eq!(holders.len(), 3);
    assert!(
        holders[0] != holders[2],
        "each request decides under a holder of its own"
    );
}

#[tokio::test]
async fn local_and_shadow_slots_are_held_until_the_outcome_drops() {
    let cfg = config(
        r#"
[[rules]]
name = "slots-local"
key = ["ip"]
algorithm = "concurrency"
limit = 1
scope = "local"

[[rules]]
name = "slots-shadow"
key = ["ip"]
algorithm = "concurrency"
limit = 1
shadow = true
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let first = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&first), "{:?}", first.verdict);
    assert!(first.shadow_rejected.is_empty());
    assert!(!first.slots.is_empty());
    let busy = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(rejected_by(&busy), ["slots-local"]);
    drop((busy, first));
    // Both slots came back: the local rule admits, and the shadow rule would have too.
    let again = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&again), "{:?}", again.verdict);
    assert!(
        again.shadow_rejected.is_empty(),
        "the shadow slot came back"
    );
    assert_eq!(fake.calls(), 0);
}
