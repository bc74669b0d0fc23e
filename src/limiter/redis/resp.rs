//! A lean, pipelined connection to one Redis server (`redis://host:port`), for the decision hot
//! path of the standalone store.
//!
//! Why not redis-rs's multiplexed connection: every call there is copied into a command of its
//! own, sent through a channel to a driver task, written by that task as soon as it runs, and
//! its reply parsed by a general parser into a `Value` tree. Here a caller writes its packed
//! command straight into the connection's one output buffer and queues its reply slot, under
//! one short lock; the writer task takes everything queued since its last write and sends it in
//! one `write` (the commands of all requests that became ready together); the reader task
//! parses replies in place and hands each to the next queued slot (Redis answers in order).
//! That is one system call for many requests and a few allocations per call.
//!
//! What it does not do, on purpose: reconnect (a broken connection fails every call at once,
//! and the store builds a new one, see `super::conn`), TLS or Unix sockets (those URLs use
//! redis-rs's connection), RESP3, pub/sub. Replies are RESP2.
//!
//! # Which reply answers which command
//! RESP carries no request ids: the n-th reply read answers the n-th command written, and
//! nothing else says so. The invariant this connection keeps is that **no reply is ever taken
//! as the answer to a command it does not answer**:
//! - a caller that stops waiting (its client left) leaves its slot in the queue, so the reply
//!   that comes for it is read into that slot and dropped, and the order holds;
//! - a reply that does not come when it should (a call past its deadline: a black-holed or
//!   stalled peer, or a reply lost on the way) may never come, or come after others were lost
//!   too, and then every later reply would land one slot early. So the caller that gave up
//!   [`poison`](RespConn::poison)s the connection: every call on it fails at once, its socket
//!   closes, and nothing is read from it again; the store opens a new one;
//! - callers that can check their reply poison the connection on a reply that is not theirs:
//!   every script the request path and its background work run (decide, release, renew,
//!   lease_return, true_up) answers with a tag the call chose. The rest (the usage API's
//!   script, `PING`, `SCRIPT LOAD`, `CONFIG GET`, `DEL`) rely on the deadline rule above: a
//!   missing reply makes some call wait past its deadline, which poisons the connection.
//!
//! Input from the network never panics: a malformed reply breaks the connection with an error.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use parking_lot::Mutex;
use redis::{Cmd, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};
use tokio::task::AbortHandle;

/// Longest bulk string or array a reply may announce (Redis' own `proto-max-bulk-len` default).
const MAX_LEN: i64 = 512 * 1024 * 1024;

/// Deepest nesting of arrays accepted in a reply.
const MAX_DEPTH: usize = 8;

/// A reply: a value, or the error message Redis answered (`-ERR ...`, `-NOSCRIPT ...`).
pub type Reply = Result<Value, String>;

/// Why a call got no reply.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RespError {
    /// The connection failed or was closed; it will not recover (build a new one).
    #[error("Redis connection lost: {0}")]
    Broken(String),
}

/// A handle on the connection. Clones share it; when the last one is dropped its tasks stop
/// and the socket closes.
#[derive(Clone)]
pub struct RespConn {
    handle: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
    tasks: [AbortHandle; 2],
}

impl Drop for Handle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.shared.fail("connection closed");
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer when `out` has something. A permit is kept when the writer is busy, so
    /// no wake-up is lost.
    wake_writer: Notify,
}

#[derive(Default)]
struct State {
    /// Packed commands not yet handed to the writer.
    out: Vec<u8>,
    /// One slot per command written or queued, in order: Redis answers in that order.
    waiting: VecDeque<oneshot::Sender<Reply>>,
    /// Set once the connection failed: every later call fails at once with it.
    broken: Option<String>,
    /// It failed because a caller poisoned it ([`RespConn::poison`]), not because the socket
    /// or Redis failed: the calls it took down are collateral.
    poisoned: bool,
}

impl Shared {
    /// Marks the connection broken and fails every call waiting for a reply.
    fn fail(&self, why: &str) {
        let waiting = {
            let mut st = self.state.lock();
            if st.broken.is_none() {
                st.broken = Some(why.to_string());
            }
            st.out.clear();
            std::mem::take(&mut st.waiting)
        };
        // Dropping the senders wakes their callers with an error; the writer wakes to exit.
        drop(waiting);
        self.wake_writer.notify_one();
    }
}

impl RespConn {
    /// Connects to `host:port` within `timeout`, then authenticates (`AUTH [user] password`),
    /// selects `db` when given and checks with `PING` that replies come, all within
    /// `handshake`: a connection is handed out only once a round trip on it has worked (a
    /// black-holed peer accepts TCP connections and answers nothing). The socket gets
    /// [`super::socket::tcp_settings`] (keepalive, user timeout). Errors never contain the
    /// password.
    pub async fn connect(
        host: &str,
        port: u16,
        username: Option<&str>,
        password: Option<&str>,
        db: i64,
        timeout: Duration,
        handshake: Duration,
    ) -> Result<RespConn, RespError> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| RespError::Broken("connect timed out".into()))?
            .map_err(|e| RespError::Broken(e.to_string()))?;
        super::socket::configure_socket(&stream).map_err(|e| RespError::Broken(e.to_string()))?;
        let conn = RespConn::spawn(stream);
        let setup = async {
            if let Some(password) = password {
                let mut auth = redis::cmd("AUTH");
                if let Some(user) = username {
                    auth.arg(user);
                }
                auth.arg(password);
                if let Err(message) = conn.query(&auth).await? {
                    // Redis' message names the failure (WRONGPASS...), never the password.
                    return Err(RespError::Broken(format!("AUTH failed: {message}")));
                }
            }
            if db != 0 {
                if let Err(message) = conn.query(redis::cmd("SELECT").arg(db)).await? {
                    return Err(RespError::Broken(format!("SELECT {db} failed: {message}")));
                }
            }
            match conn.query(&redis::cmd("PING")).await? {
                Ok(Value::SimpleString(s)) if s == "PONG" => Ok(()),
                Ok(other) => Err(RespError::Broken(format!(
                    "PING answered {other:?}, not PONG"
                ))),
                Err(message) => Err(RespError::Broken(format!("PING failed: {message}"))),
            }
        };
        match tokio::time::timeout(handshake, setup).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(e)) => {
                conn.poison(&e.to_string());
                Err(e)
            }
            Err(_) => {
                conn.poison("handshake timed out");
                Err(RespError::Broken("handshake timed out".into()))
            }
        }
    }

    fn spawn(stream: TcpStream) -> RespConn {
        let (read, write) = stream.into_split();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake_writer: Notify::new(),
        });
        let writer = tokio::spawn(write_loop(shared.clone(), write)).abort_handle();
        let reader = tokio::spawn(read_loop(shared.clone(), read)).abort_handle();
        RespConn {
            handle: Arc::new(Handle {
                shared,
                tasks: [writer, reader],
            }),
        }
    }

    /// Sends `cmd` and waits for its reply. The caller bounds the wait (a dropped call leaves
    /// its slot in the queue; the reply is discarded when it comes).
    pub async fn query(&self, cmd: &Cmd) -> Result<Reply, RespError> {
        let shared = &self.handle.shared;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = shared.state.lock();
            if let Some(why) = &st.broken {
                return Err(RespError::Broken(why.clone()));
            }
            cmd.write_packed_command(&mut st.out);
            st.waiting.push_back(tx);
        }
        shared.wake_writer.notify_one();
        rx.await.map_err(|_| {
            let why = shared.state.lock().broken.clone();
            RespError::Broken(why.unwrap_or_else(|| "connection closed".into()))
        })
    }

    /// Fails the connection for good: every call waiting on it and every later call fail at
    /// once with `why`, its tasks stop and its socket closes, so nothing is read from it again.
    /// Called when a reply is missing (a call gave up waiting for it) or is not the caller's:
    /// the order that matches replies to commands is lost (see the module doc).
    /// Returns whether this call poisoned it (`false`: it was poisoned or broken already).
    pub fn poison(&self, why: &str) -> bool {
        let first = {
            let mut st = self.handle.shared.state.lock();
            let first = st.broken.is_none();
            st.poisoned |= first;
            first
        };
        self.handle.shared.fail(why);
        for t in &self.handle.tasks {
            t.abort();
        }
        first
    }

    /// Whether a caller poisoned the connection ([`RespConn::poison`]): the calls that failed
    /// with it failed for another call's missing reply, not for their own.
    pub fn was_poisoned(&self) -> bool {
        self.handle.shared.state.lock().poisoned
    }

    /// Whether the connection failed (every call on it fails; a new one is needed), or its
    /// tasks are gone (the runtime that ran them shut down: nothing would answer a call).
    pub fn is_broken(&self) -> bool {
        self.handle.shared.state.lock().broken.is_some()
            || self.handle.tasks.iter().any(AbortHandle::is_finished)
    }
}

async fn write_loop(shared: Arc<Shared>, mut socket: tokio::net::tcp::OwnedWriteHalf) {
    let mut sending = Vec::with_capacity(16 * 1024);
    loop {
        shared.wake_writer.notified().await;
        {
            let mut st = shared.state.lock();
            if st.broken.is_some() {
                return;
            }
            std::mem::swap(&mut st.out, &mut sending);
        }
        if sending.is_empty() {
            continue;
        }
        if let Err(e) = socket.write_all(&sending).await {
            shared.fail(&e.to_string());
            return;
        }
        sending.clear();
        // A buffer grown by a burst is not kept forever.
        sending.shrink_to(64 * 1024);
    }
}

async fn read_loop(shared: Arc<Shared>, mut socket: tokio::net::tcp::OwnedReadHalf) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        loop {
            match parse(&buf, 0) {
                Ok(Some((reply, used))) => {
                    buf.advance(used);
                    let slot = shared.state.lock().waiting.pop_front();
                    match slot {
                        // The caller may have stopped waiting (its timeout): nothing to do.
                        Some(tx) => {
                            let _ = tx.send(reply);
                        }
                        None => {
                            shared.fail("reply without a request");
                            return;
                        }
                    }
                }
                Ok(None) => break,
                Err(why) => {
                    shared.fail(&format!("malformed reply: {why}"));
                    return;
                }
            }
        }
        match socket.read_buf(&mut buf).await {
            Ok(0) => {
                shared.fail("connection closed by Redis");
                return;
            }
            Ok(_) => {}
            Err(e) => {
                shared.fail(&e.to_string());
                return;
            }
        }
    }
}

/// One complete RESP2 reply at the start of `buf` and the bytes it takes; `None` when more
/// bytes are needed. `depth` is how deep in arrays `buf` starts (callers pass 0). Public for
/// the property tests in `tests/fuzz.rs`.
pub fn parse(buf: &[u8], depth: usize) -> Result<Option<(Reply, usize)>, &'static str> {
    let Some((&kind, rest)) = buf.split_first() else {
        return Ok(None);
    };
    let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = &rest[..end];
    let after = 1 + end + 2;
    match kind {
        b'+' => {
            let s = std::str::from_utf8(line).map_err(|_| "status is not UTF-8")?;
            let v = if s == "OK" {
                Value::Okay
            } else {
                Value::SimpleString(s.to_string())
            };
            Ok(Some((Ok(v), after)))
        }
        b'-' => Ok(Some((
            Err(String::from_utf8_lossy(line).into_owned()),
            after,
        ))),
        b':' => Ok(Some((Ok(Value::Int(number(line)?)), after))),
        b'$' => {
            let len = number(line)?;
            if len < 0 {
                return Ok(Some((Ok(Value::Nil), after)));
            }
            if len > MAX_LEN {
                return Err("bulk string too long");
            }
            let len = len as usize;
            if buf.len() < after + len + 2 {
                return Ok(None);
            }
            if &buf[after + len..after + len + 2] != b"\r\n" {
                return Err("bulk string not terminated");
            }
            let data = buf[after..after + len].to_vec();
            Ok(Some((Ok(Value::BulkString(data)), after + len + 2)))
        }
        b'*' => {
            let len = number(line)?;
            if len < 0 {
                return Ok(Some((Ok(Value::Nil), after)));
            }
            if len > MAX_LEN || depth >= MAX_DEPTH {
                return Err("array too long or too deep");
            }
            // Each element takes at least 3 bytes: no allocation beyond what arrived.
            let mut items = Vec::with_capacity((len as usize).min(buf.len() / 3));
            let mut at = after;
            for _ in 0..len {
                match parse(&buf[at..], depth + 1)? {
                    Some((Ok(v), used)) => {
                        items.push(v);
                        at += used;
                    }
                    // An error inside an array (EXEC replies): kept as a status string.
                    Some((Err(e), used)) => {
                        items.push(Value::SimpleString(e));
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Ok(Value::Array(items)), at)))
        }
        _ => Err("unknown reply type"),
    }
}

fn number(line: &[u8]) -> Result<i64, &'static str> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or("bad number")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers the connection's `PING` and then reads everything and answers
    /// nothing (a stalled or black-holed Redis); tells when the client closed the socket.
    async fn silent_after_ping() -> (u16, oneshot::Receiver<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (closed_tx, closed) = oneshot::channel();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0; 4096];
            let mut answered = false;
            loop {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) if !answered => {
                        answered = true;
                        socket.write_all(b"+PONG\r\n").await.unwrap();
                    }
                    Ok(_) => {}
                }
            }
            let _ = closed_tx.send(());
        });
        (port, closed)
    }

    #[tokio::test]
    async fn a_call_without_its_reply_poisons_the_connection_and_it_is_never_read_again() {
        let (port, closed) = silent_after_ping().await;
        let timeout = Duration::from_secs(5);
        let conn = RespConn::connect("127.0.0.1", port, None, None, 0, timeout, timeout)
            .await
            .expect("PING answered");
        let ping = redis::cmd("PING");
        // Two calls in flight; the first gives up waiting.
        let waiting = tokio::spawn({
            let conn = conn.clone();
            let ping = ping.clone();
            async move { conn.query(&ping).await }
        });
        let gave_up = tokio::time::timeout(Duration::from_millis(50), conn.query(&ping)).await;
        assert!(gave_up.is_err());
        assert!(
            !conn.is_broken(),
            "a caller that stops waiting changes nothing by itself"
        );
        assert!(conn.poison("no reply"), "the first poison");
        assert!(!conn.poison("no reply"), "already poisoned");
        assert!(conn.is_broken() && conn.was_poisoned());
        // The call still in flight fails at once, and so does every later one.
        let failed = tokio::time::timeout(timeout, waiting)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(failed, Err(RespError::Broken(ref why)) if why == "no reply"));
        assert!(conn.query(&ping).await.is_err());
        // The socket is closed: nothing can be read from it again.
        tokio::time::timeout(timeout, closed)
            .await
            .expect("the server sees the connection closed")
            .unwrap();
    }

    #[tokio::test]
    async fn a_peer_that_accepts_but_never_answers_yields_no_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
            drop(socket);
        });
        let made = RespConn::connect(
            "127.0.0.1",
            port,
            None,
            None,
            0,
            Duration::from_secs(5),
            Duration::from_millis(100),
        )
        .await;
        assert!(
            matches!(made, Err(RespError::Broken(ref why)) if why == "handshake timed out"),
            "{:?}",
            made.err()
        );
        held.abort();
    }

    fn one(input: &[u8]) -> (Reply, usize) {
        parse(input, 0).unwrap().unwrap()
    }

    #[test]
    fn parses_every_reply_type() {
        assert_eq!(one(b"+OK\r\n"), (Ok(Value::Okay), 5));
        assert_eq!(
            one(b"+PONG\r\n"),
            (Ok(Value::SimpleString("PONG".into())), 7)
        );
        assert_eq!(one(b":-42\r\n"), (Ok(Value::Int(-42)), 6));
        assert_eq!(
            one(b"-NOSCRIPT No matching script\r\n"),
            (Err("NOSCRIPT No matching script".into()), 30)
        );
        assert_eq!(
            one(b"$5\r\na\r\nbc\r\n"),
            (Ok(Value::BulkString(b"a\r\nbc".to_vec())), 11)
        );
        assert_eq!(one(b"$-1\r\n"), (Ok(Value::Nil), 5));
        assert_eq!(
            one(b"*2\r\n$3\r\nfoo\r\n:1\r\n+rest"),
            (
                Ok(Value::Array(vec![
                    Value::BulkString(b"foo".to_vec()),
                    Value::Int(1)
                ])),
                17
            )
        );
    }

    #[test]
    fn incomplete_replies_wait_for_more_bytes() {
        for input in [
            &b""[..],
            b"+OK",
            b"+OK\r",
            b"$5\r\nab",
            b"$5\r\nabcde",
            b"*2\r\n:1\r\n",
        ] {
            assert_eq!(parse(input, 0), Ok(None), "{input:?}");
        }
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        for input in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b"$3\r\nabcXY",
            b"$99999999999\r\n",
            b"*99999999999\r\n",
        ] {
            assert!(parse(input, 0).is_err(), "{input:?}");
        }
        let deep = b"*1\r\n".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep, 0).is_err());
    }
}
