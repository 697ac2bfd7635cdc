//! The byte ring of a pipe (`workload=sched-messaging`), and the message
//! format its senders and receivers use.
//!
//! The ring keeps only indices; the kernel owns the buffer (one frame per
//! pipe) and passes it in, so the logic is testable here without memory of
//! its own. Writes of at most [`PIPE_BUF`] bytes are atomic, as on Linux:
//! the kernel blocks a writer until [`Ring::free`] covers the whole write.

/// Bytes a pipe holds (one page, as Linux's minimum pipe size).
pub const PIPE_SIZE: usize = 4096;
/// Largest write that is atomic (and the largest the kernel accepts).
pub const PIPE_BUF: usize = PIPE_SIZE;

/// First file descriptor of a task's pipe ends (0..2 are stdio).
pub const FIRST_PIPE_FD: usize = 3;

/// Head and fill level of a pipe's ring buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ring {
    head: usize,
    len: usize,
}

impl Ring {
    /// An empty ring.
    pub const EMPTY: Ring = Ring { head: 0, len: 0 };

    /// Bytes waiting to be read.
    pub const fn len(&self) -> usize {
        self.len
    }
    /// Whether no bytes wait to be read.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes that can be written without blocking.
    pub const fn free(&self) -> usize {
        PIPE_SIZE - self.len
    }

    /// Appends as much of `data` as fits; returns the bytes taken.
    pub fn push(&mut self, buf: &mut [u8; PIPE_SIZE], data: &[u8]) -> usize {
        let n = data.len().min(self.free());
        let tail = (self.head + self.len) % PIPE_SIZE;
        let first = n.min(PIPE_SIZE - tail);
        buf[tail..tail + first].copy_from_slice(&data[..first]);
        buf[..n - first].copy_from_slice(&data[first..n]);
        self.len += n;
        n
    }

    /// Takes up to `out.len()` bytes; returns how many.
    pub fn pop(&mut self, buf: &[u8; PIPE_SIZE], out: &mut [u8]) -> usize {
        let n = out.len().min(self.len);
        let first = n.min(PIPE_SIZE - self.head);
        out[..first].copy_from_slice(&buf[self.head..self.head + first]);
        out[first..n].copy_from_slice(&buf[..n - first]);
        self.head = (self.head + n) % PIPE_SIZE;
        self.len -= n;
        n
    }
}

/// The messages of sched-messaging (perf bench: 100 bytes each). Words are
/// 32-bit little-endian so that both flavours' user programs build and
/// check them the same way:
///
/// | word | bytes | content |
/// | --- | --- | --- |
/// | 0 | 0..4 | [`message::TAG`] \| group << 16 \| sender index in the group |
/// | 1 | 4..8 | sequence number (0..loops) |
/// | 2 | 8..12 | receiver index in the group |
/// | 3..24 | 12..96 | zero |
/// | 24 | 96..100 | word 0 ^ word 1 ^ word 2 ^ [`message::CHECK`] |
///
/// A receiver counts a message as wrong unless the tag, group, receiver
/// and check word match, the sender index is in range and the sequence is
/// the next one expected from that sender; at the end, every sender must
/// have delivered exactly `loops` messages.
pub mod message {
    /// Bytes per message.
    pub const SIZE: usize = 100;
    /// High byte of word 0.
    pub const TAG: u32 = 0x4d00_0000;
    /// XORed into the last word.
    pub const CHECK: u32 = 0x5a5a_5a5a;
    /// Offset of the check word.
    pub const CHECK_OFFSET: usize = 96;

    /// Word 0 of a message.
    pub const fn word0(group: u32, sender: u32) -> u32 {
        TAG | group << 16 | sender
    }

    /// The message `sender` of `group` sends to `receiver` as number `seq`.
    pub fn encode(group: u32, sender: u32, receiver: u32, seq: u32) -> [u8; SIZE] {
        let mut m = [0u8; SIZE];
        let w0 = word0(group, sender);
        m[0..4].copy_from_slice(&w0.to_le_bytes());
        m[4..8].copy_from_slice(&seq.to_le_bytes());
        m[8..12].copy_from_slice(&receiver.to_le_bytes());
        let check = w0 ^ seq ^ receiver ^ CHECK;
        m[CHECK_OFFSET..SIZE].copy_from_slice(&check.to_le_bytes());
        m
    }

    /// (group, sender, receiver, seq) of a well-formed message.
    pub fn decode(m: &[u8; SIZE]) -> Option<(u32, u32, u32, u32)> {
        let w = |i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
        let (w0, seq, receiver) = (w(0), w(4), w(8));
        if w0 & 0xff00_0000 != TAG || w(CHECK_OFFSET) != w0 ^ seq ^ receiver ^ CHECK {
            return None;
        }
        Some(((w0 >> 16) & 0xff, w0 & 0xffff, receiver, seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn fills_to_capacity_and_drains_in_order() {
        let mut buf = [0u8; PIPE_SIZE];
        let mut r = Ring::EMPTY;
        assert!(r.is_empty());
        let data: Vec<u8> = (0..PIPE_SIZE + 10).map(|i| (i * 7) as u8).collect();
        assert_eq!(r.push(&mut buf, &data), PIPE_SIZE, "only what fits");
        assert_eq!((r.len(), r.free()), (PIPE_SIZE, 0));
        assert_eq!(r.push(&mut buf, &[1]), 0, "a full pipe takes nothing");
        let mut out = [0u8; 1000];
        assert_eq!(r.pop(&buf, &mut out), 1000);
        assert_eq!(&out[..], &data[..1000]);
        assert_eq!(r.free(), 1000);
    }

    #[test]
    fn wraps_around_the_end_of_the_buffer() {
        let mut buf = [0u8; PIPE_SIZE];
        let mut r = Ring::EMPTY;
        // 100-byte messages, as sched-messaging writes them: after 40 the
        // 41st wraps (4000 + 100 > 4096).
        let mut sent = 0u32;
        let mut got = 0u32;
        for round in 0..200 {
            while r.free() >= message::SIZE {
                let m = message::encode(1, sent % 20, 3, sent);
                assert_eq!(r.push(&mut buf, &m), message::SIZE);
                sent += 1;
            }
            // Drain a varying number, to move the head around.
            for _ in 0..(round % 7 + 1) {
                let mut m = [0u8; message::SIZE];
                assert_eq!(r.pop(&buf, &mut m), message::SIZE);
                assert_eq!(message::decode(&m), Some((1, got % 20, 3, got)));
                got += 1;
            }
        }
        assert!(got > 700 && sent > got);
    }

    #[test]
    fn short_reads_take_what_is_there() {
        let mut buf = [0u8; PIPE_SIZE];
        let mut r = Ring::EMPTY;
        r.push(&mut buf, &[1, 2, 3]);
        let mut out = [0u8; 100];
        assert_eq!(r.pop(&buf, &mut out), 3);
        assert_eq!(&out[..3], &[1, 2, 3]);
        assert_eq!(r.pop(&buf, &mut out), 0);
        assert!(r.is_empty());
    }

    #[test]
    fn message_layout_and_checks() {
        let m = message::encode(2, 19, 7, 0x1234);
        assert_eq!(&m[0..4], &0x4d02_0013u32.to_le_bytes());
        assert_eq!(&m[4..8], &0x1234u32.to_le_bytes());
        assert_eq!(&m[8..12], &7u32.to_le_bytes());
        assert!(m[12..96].iter().all(|&b| b == 0));
        assert_eq!(message::decode(&m), Some((2, 19, 7, 0x1234)));
        let mut bad = m;
        bad[5] ^= 1;
        assert_eq!(
            message::decode(&bad),
            None,
            "sequence changed, check word not"
        );
        let mut bad = m;
        bad[3] = 0;
        assert_eq!(message::decode(&bad), None, "tag lost");
        assert_eq!(message::word0(0, 0), message::TAG);
    }
}
