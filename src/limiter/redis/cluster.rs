//! Redis Cluster hash slots: one script call may only touch keys of one hash slot, so a
//! request's keys are grouped by slot and each group is decided by a call of its own; and the
//! slot of a key says which master (see `topology`) answers for it.
//!
//! The counter id is each Redis key's hash tag (`…:{<digest>}`), so the checks of rules keyed on the
//! same parts share a slot and are decided in one atomic call.

/// Hash slots of a Redis Cluster.
pub(super) const SLOTS: u16 = 16384;

/// The hash slot of `key`, as Redis computes it: CRC16 (XMODEM) of its hash tag (the first
/// non-empty `{...}`), or of the whole key when it has none, modulo [`SLOTS`].
pub(super) fn slot(key: &str) -> u16 {
    let key = key.as_bytes();
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-XMODEM (polynomial 0x1021, initial value 0), bit by bit: keys are short.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Indexes of `keys` grouped by what one script call may touch: all of them (standalone), or
/// one group per hash slot (`cluster`), in order of first appearance.
pub(super) fn groups(cluster: bool, keys: &[String]) -> Vec<Vec<usize>> {
    if !cluster {
        return vec![(0..keys.len()).collect()];
    }
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = slot(key);
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
    use redis::cluster_routing::Slot;

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

    /// Slots are those redis-rs routes by (and Redis' own: "123456789" is 0x31C3).
    #[test]
    fn slots_are_redis_slots() {
        assert_eq!(crc16(b"123456789"), 0x31c3);
        for key in [
            "fg:a:{00000000000000aa}",
            "plain",
            "{}empty-tag",
            "a{b}c{d}",
            "{unclosed",
            "",
            "fg:rule:{0123456789abcdef}",
        ] {
            assert_eq!(Slot::new(slot(key)), Some(Slot::for_key(key)), "{key}");
        }
    }
}
