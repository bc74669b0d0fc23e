//! Redis Cluster slot grouping: one script call may only touch keys of one hash slot, so a
//! request's keys are grouped by slot and each group is decided by a call of its own.
//!
//! The counter id is each Redis key's hash tag (`…:{<digest>}`), so the checks of rules keyed on the
//! same parts share a slot and are decided in one atomic call.

use redis::cluster_routing::Slot;

/// Indexes of `keys` grouped by what one script call may touch: all of them (standalone), or
/// one group per hash slot (`cluster`), in order of first appearance.
pub(super) fn groups(cluster: bool, keys: &[String]) -> Vec<Vec<usize>> {
    if !cluster {
        return vec![(0..keys.len()).collect()];
    }
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = Slot::for_key(key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, g)) => g.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sharing_a_hash_tag_share_a_call() {
        let keys: Vec<String> = [
            "fg:a:{00000000000000aa}",
            "fg:b:{00000000000000bb}",
            "fg:c:{00000000000000aa}",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(groups(false, &keys), [vec![0, 1, 2]]);
        let grouped = groups(true, &keys);
        assert_eq!(grouped.len(), 2, "two hash tags, two slots: {grouped:?}");
        assert_eq!(
            grouped[0],
            [0, 2],
            "same tag, same call, first-appearance order"
        );
        assert_eq!(grouped[1], [1]);
    }
}
