//! Counts the PINGs a client sends on an HTTP/2 connection, so that a connection an Envoy
//! keeps warm with PINGs (`connection_keepalive`) is not closed as idle.
//!
//! hyper answers PINGs without telling anyone, so the rate-limit service reads the frame
//! headers of the bytes it receives (after TLS): 9 bytes each, RFC 9113 §4.1, the payload
//! skipped by its length. A client can hold a connection open this way as it could by calling;
//! the listener's connection caps bound both.

/// HTTP/2's connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;

/// A frame header's length.
const HEADER_LEN: usize = 9;

/// The PING frame type (RFC 9113 §6.7) and its ACK flag.
const PING: u8 = 0x6;
const ACK: u8 = 0x1;

/// Where the reader is in the client's byte stream.
#[derive(Debug)]
pub struct PingCounter {
    /// Preface bytes still to pass over.
    preface_left: usize,
    /// The frame header being read, and how much of it has arrived.
    head: [u8; HEADER_LEN],
    have: usize,
    /// Payload bytes of the current frame still to pass over.
    skip: usize,
}

impl Default for PingCounter {
    fn default() -> Self {
        PingCounter {
            preface_left: PREFACE_LEN,
            head: [0; HEADER_LEN],
            have: 0,
            skip: 0,
        }
    }
}

impl PingCounter {
    /// Whether the whole 24-byte preface has been read.
    pub fn past_preface(&self) -> bool {
        self.preface_left == 0
    }

    /// Reads the next received `bytes`; returns how many PINGs (not ACKs) they completed.
    pub fn feed(&mut self, mut bytes: &[u8]) -> usize {
        let mut pings = 0;
        while !bytes.is_empty() {
            let pass = self.preface_left.max(self.skip);
            if pass > 0 {
                let n = pass.min(bytes.len());
                if self.preface_left > 0 {
                    self.preface_left -= n;
                } else {
                    self.skip -= n;
                }
                bytes = &bytes[n..];
                continue;
            }
            let n = (HEADER_LEN - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == HEADER_LEN {
                self.have = 0;
                let [a, b, c, kind, flags, ..] = self.head;
                self.skip = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
                if kind == PING && flags & ACK == 0 {
                    pings += 1;
                }
            }
        }
        pings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&[0, 0, 0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn pings_are_counted_across_any_split_and_acks_and_payloads_are_not() {
        let mut stream = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        stream.extend(frame(0x4, 0, &[0; 12])); // SETTINGS
        stream.extend(frame(PING, 0, &[7; 8]));
        stream.extend(frame(PING, ACK, &[7; 8]));
        // A DATA frame whose payload looks like a PING frame header.
        stream.extend(frame(0x0, 0, &frame(PING, 0, &[1; 8])));
        stream.extend(frame(PING, 0, &[8; 8]));
        for chunk in [1, 2, 5, 9, 10, 17, stream.len()] {
            let mut counter = PingCounter::default();
            let pings: usize = stream.chunks(chunk).map(|c| counter.feed(c)).sum();
            assert_eq!(pings, 2, "read {chunk} bytes at a time");
        }
    }
}
