//! The response write buffer of a plain client connection, held only while an exchange writes.
//!
//! Pingora gives every connection a write buffer of one MSS (1,460 bytes) for its whole life, so
//! that a response's head and a small body leave in one write; on an idle kept-alive
//! connection that is a resident 1.5 KiB doing nothing. Plain listeners are built without it
//! (`crate::server`) and [`GuardedStream`](super::GuardedStream) buffers through this instead:
//! the same semantics as tokio's `BufWriter` (which Pingora's buffer is), but the allocation is
//! made by the first write of an exchange and given back when the connection waits for its next
//! request ([`WriteBuffer::release`]).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::AsyncWrite;

/// As much as Pingora's own buffer holds: one MSS.
pub const CAPACITY: usize = 1460;

/// Bytes written by the proxy and not yet passed to the socket.
#[derive(Debug, Default)]
pub struct WriteBuffer {
    buf: Vec<u8>,
    /// How much of `buf` a flush in progress has passed on.
    written: usize,
}

impl WriteBuffer {
    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Gives the allocation back (only when nothing is buffered): the connection is idle.
    pub fn release(&mut self) {
        if self.buf.is_empty() {
            self.buf = Vec::new();
            self.written = 0;
        }
    }

    fn room(&self) -> usize {
        CAPACITY.saturating_sub(self.buf.len())
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(CAPACITY);
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Passes every buffered byte to `inner`.
    pub fn flush_into<W: AsyncWrite + Unpin>(
        &mut self,
        inner: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let mut result = Ok(());
        while self.written < self.buf.len() {
            match ready!(Pin::new(&mut *inner).poll_write(cx, &self.buf[self.written..])) {
                Ok(0) => {
                    result = Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "failed to write the buffered data",
                    ));
                    break;
                }
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if self.written > 0 {
            self.buf.drain(..self.written);
        }
        self.written = 0;
        Poll::Ready(result)
    }

    /// `poll_write` through the buffer (tokio's `BufWriter::poll_write`).
    pub fn poll_write<W: AsyncWrite + Unpin>(
        &mut self,
        inner: &mut W,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        if bytes.len() > self.room() {
            ready!(self.flush_into(inner, cx))?;
        }
        if bytes.len() >= CAPACITY {
            return Pin::new(inner).poll_write(cx, bytes);
        }
        self.push(bytes);
        Poll::Ready(Ok(bytes.len()))
    }

    /// `poll_write_vectored` through the buffer (tokio's `BufWriter`, for a vectored writer).
    pub fn poll_write_vectored<W: AsyncWrite + Unpin>(
        &mut self,
        inner: &mut W,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total = bufs.iter().fold(0usize, |n, b| n.saturating_add(b.len()));
        if total > self.room() {
            ready!(self.flush_into(inner, cx))?;
        }
        if total >= CAPACITY {
            return Pin::new(inner).poll_write_vectored(cx, bufs);
        }
        for b in bufs {
            self.push(b);
        }
        Poll::Ready(Ok(total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    /// A writer that records each write call.
    #[derive(Default)]
    struct Calls(Vec<Vec<u8>>);

    impl AsyncWrite for Calls {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn small_writes_leave_in_one_call_and_the_allocation_goes_when_idle() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut w = WriteBuffer::default();
        let mut out = Calls::default();
        assert!(w
            .poll_write(&mut out, &mut cx, b"HTTP/1.1 200 OK\r\n\r\n")
            .is_ready());
        let slices = [IoSlice::new(b"o"), IoSlice::new(b"k")];
        assert!(w.poll_write_vectored(&mut out, &mut cx, &slices).is_ready());
        assert!(out.0.is_empty(), "nothing is written before the flush");
        assert!(w.flush_into(&mut out, &mut cx).is_ready());
        assert_eq!(out.0, vec![b"HTTP/1.1 200 OK\r\n\r\nok".to_vec()]);
        assert!(w.is_empty());
        assert_eq!(w.buf.capacity(), CAPACITY);
        w.release();
        assert_eq!(w.buf.capacity(), 0);
    }

    #[test]
    fn a_write_past_the_capacity_flushes_first_and_a_large_one_goes_straight_through() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut w = WriteBuffer::default();
        let mut out = Calls::default();
        let _ = w.poll_write(&mut out, &mut cx, &[b'a'; 1000]);
        let _ = w.poll_write(&mut out, &mut cx, &[b'b'; 1000]);
        assert_eq!(out.0, vec![vec![b'a'; 1000]]);
        let _ = w.poll_write(&mut out, &mut cx, &[b'c'; CAPACITY]);
        assert_eq!(
            out.0,
            vec![vec![b'a'; 1000], vec![b'b'; 1000], vec![b'c'; CAPACITY]]
        );
        assert!(w.is_empty());
    }
}
