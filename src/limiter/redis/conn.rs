//! Connection lifecycle: what the store connects with (built from `store.url(s)`, and built the
//! same way by validation), the live connection every request shares, and the background task
//! that (re)connects with backoff.
//!
//! A `redis://` server is reached over floodgate's own pipelined connection ([`super::resp`]),
//! which does not reconnect: when it breaks, the store starts this task again. The redis-rs
//! connections (`rediss://` and Unix sockets; clusters, which also follow MOVED/ASK and
//! rediscover slots) reconnect by themselves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    Cmd, ConnectionAddr, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisResult,
    ServerErrorKind, Value,
};

use super::resp::{RespConn, RespError};
use super::script::Lua;
use super::socket::{tcp_settings, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT};
use crate::limiter::settings::Backend;

/// Retries of one cluster call inside redis-rs (see [`RedisClient::build`]).
const CLUSTER_RETRIES: u32 = 1;

/// Backoff between background connection attempts while Redis cannot be reached.
pub(super) const RECONNECT_MIN: Duration = Duration::from_millis(100);
pub(super) const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// Where to connect.
#[derive(Clone)]
pub(super) enum Target {
    Single(Box<redis::Client>),
    /// The cluster client, and one plain client per seed: the reset listener subscribes
    /// through one of them (a cluster delivers every `PUBLISH` to every node).
    Cluster(Box<ClusterClient>, Arc<[redis::Client]>),
    /// The URL(s) could not be turned into a client: why (never the URL itself).
    Broken(Arc<str>),
}

/// A Redis URL (or set of cluster seeds) the store cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UrlError {
    /// Which URL is at fault (0-based, in `store.urls`), or `None` when it is the set of URLs
    /// (cluster seeds that disagree) or the backend.
    pub index: Option<usize>,
    /// What is wrong, without the URL (which may hold a password).
    pub message: String,
}

/// What the store connects with, built from `store.url(s)`. Validation builds one too and
/// throws it away, so that `floodgate check` accepts exactly the URLs the store can use: the
/// same parser (redis-rs `IntoConnectionInfo`) and the same client construction.
#[derive(Clone)]
pub struct RedisClient {
    pub(super) target: Target,
    pub(super) endpoint: String,
}

/// Only the endpoint: the URLs may carry a password.
impl std::fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClient")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl RedisClient {
    /// Parses `urls` for `backend` as the store does, building the redis-rs client (no
    /// connection is made).
    pub fn build(backend: Backend, urls: &[String]) -> Result<RedisClient, UrlError> {
        let at = |index: Option<usize>, message: String| UrlError { index, message };
        let mut endpoints = Vec::with_capacity(urls.len());
        for (i, url) in urls.iter().enumerate() {
            let info = url.as_str().into_connection_info().map_err(|e| {
                at(
                    Some(i),
                    format!(
                        "store URL #{} is not a Redis URL the store can use ({}); write redis://[user:password@]host[:port][/db] or rediss://...",
                        i + 1,
                        redis_reason(&e)
                    ),
                )
            })?;
            if info.redis_settings().db() < 0 {
                return Err(at(
                    Some(i),
                    format!(
                        "store URL #{}: the database number must not be negative",
                        i + 1
                    ),
                ));
            }
            endpoints.push(info.addr().to_string());
        }
        let target = match backend {
            Backend::Redis => {
                let [url] = urls else {
                    return Err(at(
                        None,
                        "store.backend = \"redis\" needs exactly one URL".into(),
                    ));
                };
                let client = open(url).map_err(|e| {
                    at(
                        Some(0),
                        format!("store.url is not a valid Redis URL ({})", redis_reason(&e)),
                    )
                })?;
                Target::Single(Box::new(client))
            }
            Backend::RedisCluster => {
                if urls.is_empty() {
                    return Err(at(
                        None,
                        "store.backend = \"redis-cluster\" needs seed URLs".into(),
                    ));
                }
                let client = ClusterClientBuilder::new(urls.iter().map(String::as_str))
                    .connection_timeout(CONNECT_TIMEOUT)
                    // One retry: enough to follow a MOVED or ASK, or to reconnect once to a
                    // restarted node. Its default (16, each reconnecting at once) made every
                    // call to a node that answers garbage open several connections; the
                    // node's breaker (see `nodes`) stands in for further retries.
                    .retries(CLUSTER_RETRIES)
                    .tcp_settings(tcp_settings())
                    .build()
                    .map_err(|e| {
                        at(
                            None,
                            format!(
                                "store.urls cannot form a cluster client ({})",
                                redis_reason(&e)
                            ),
                        )
                    })?;
                let seeds = urls
                    .iter()
                    .enumerate()
                    .map(|(i, url)| {
                        open(url).map_err(|e| {
                            at(
                                Some(i),
                                format!(
                                    "store URL #{} is not a valid Redis URL ({})",
                                    i + 1,
                                    redis_reason(&e)
                                ),
                            )
                        })
                    })
                    .collect::<Result<Arc<[_]>, _>>()?;
                Target::Cluster(Box::new(client), seeds)
            }
            Backend::Memory => {
                return Err(at(
                    None,
                    "store.backend = \"memory\" has no Redis store".into(),
                ))
            }
        };
        Ok(RedisClient {
            target,
            endpoint: endpoints.join(","),
        })
    }
}

/// A redis-rs client for `url` whose connections get [`tcp_settings`].
fn open(url: &str) -> redis::RedisResult<redis::Client> {
    let info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
    redis::Client::open(info)
}

/// redis-rs's reason for refusing a URL or a client: its fixed description (and detail, such
/// as an unknown `protocol`), which never repeat the URL.
fn redis_reason(e: &redis::RedisError) -> String {
    e.to_string().replace(" - InvalidClientConfig", "")
}

/// A live connection, a cheap handle shared by every request. `Lean` (a `redis://` server) is
/// floodgate's own pipelined connection ([`super::resp`]): when it breaks, the store builds a
/// new one. The redis-rs ones (`rediss://` and Unix sockets; clusters, which also follow
/// MOVED/ASK and rediscover slots) reconnect by themselves when their socket fails, but not
/// when a reply goes missing on a socket that stays open: each carries a [`Lost`] flag that
/// [`Conn::poison`] sets, and the store replaces a poisoned connection as it replaces a broken
/// `Lean` one.
#[derive(Clone)]
pub(super) enum Conn {
    Lean(RespConn),
    Single(ConnectionManager, Lost),
    Cluster(ClusterConnection, Lost),
}

/// Set once a reply went missing on a redis-rs connection: the store replaces it.
pub(super) type Lost = Arc<AtomicBool>;

impl Conn {
    /// Runs `cmd` on this connection.
    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Lean(c) => match c.query(cmd).await {
                Ok(Ok(value)) => Ok(T::from_redis_value(value)?),
                Ok(Err(message)) => Err(server_error(message)),
                Err(e) => Err((ErrorKind::Io, "Redis connection", e.to_string()).into()),
            },
            Conn::Single(c, _) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c, _) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Runs `cmd`, an `EVALSHA` of `script` (see [`Lua::evalsha`]); when Redis no longer
    /// knows the script (`SCRIPT FLUSH`, a restart, a failover to a fresh node) loads it and
    /// runs `cmd` once more.
    pub(super) async fn eval<T: FromRedisValue>(&self, script: &Lua, cmd: &Cmd) -> RedisResult<T> {
        match self.query(cmd).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.query::<String>(&script.load()).await?;
                self.query(cmd).await
            }
            reply => reply,
        }
    }

    /// Loads `scripts` on the server, or on every master of a cluster (what the warm-up
    /// does before the gateway accepts requests).
    pub(super) async fn load_scripts(&self, scripts: &[&Lua]) -> RedisResult<()> {
        for script in scripts {
            self.everywhere(script.load()).await?;
        }
        Ok(())
    }

    /// Runs `cmd` on the node holding its key (the server, standalone).
    pub(super) async fn on_key<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        self.query(cmd).await
    }

    /// Whether a new connection must be built: ours broke or was poisoned, or a reply went
    /// missing on a redis-rs one (which otherwise reconnects by itself).
    pub(super) fn is_broken(&self) -> bool {
        match self {
            Conn::Lean(c) => c.is_broken(),
            Conn::Single(_, lost) | Conn::Cluster(_, lost) => lost.load(Ordering::Acquire),
        }
    }

    /// Whether every call on it fails at once (ours, broken): a caller waits for the next one
    /// instead. A poisoned redis-rs connection still serves until its successor is up: it
    /// keeps its own order of replies, and a cluster's serves its healthy masters meanwhile.
    pub(super) fn is_dead(&self) -> bool {
        matches!(self, Conn::Lean(c) if c.is_broken())
    }

    /// Whether a failed call on this connection failed only because another call poisoned
    /// it (ours fails every call in flight then; a redis-rs one keeps serving them).
    pub(super) fn was_poisoned(&self) -> bool {
        matches!(self, Conn::Lean(c) if c.was_poisoned())
    }

    /// `call`, a call on this connection, until `deadline`. Past it the reply is missing and
    /// the connection is poisoned ([`Conn::poison`]): `None`.
    pub(super) async fn until<T>(
        &self,
        deadline: tokio::time::Instant,
        call: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        match tokio::time::timeout_at(deadline, call).await {
            Ok(out) => Some(out),
            Err(_) => {
                let _ = self.poison("a call got no reply within its deadline");
                None
            }
        }
    }

    /// A call on this connection got no reply in time, or a reply that was not its own: it
    /// is never trusted again (see [`super::resp`]'s invariant). Ours fails at once and
    /// closes; a redis-rs one is marked for replacement.
    /// Returns whether this call poisoned it (`false`: that happened before).
    pub(super) fn poison(&self, why: &str) -> bool {
        match self {
            Conn::Lean(c) => c.poison(why),
            Conn::Single(_, lost) | Conn::Cluster(_, lost) => !lost.swap(true, Ordering::AcqRel),
        }
    }

    /// Sends `cmd` to the cluster node at `host:port` (to the server, standalone).
    pub(super) async fn on_node(
        &self,
        cmd: redis::Cmd,
        host: &str,
        port: u16,
    ) -> RedisResult<Value> {
        match self {
            Conn::Cluster(c, _) => {
                let to = SingleNodeRoutingInfo::ByAddress {
                    host: host.to_string(),
                    port,
                };
                c.clone()
                    .route_command(cmd, RoutingInfo::SingleNode(to))
                    .await
            }
            _ => self.query(&cmd).await,
        }
    }

    /// Sends `cmd` to the server, or to every master of a cluster.
    pub(super) async fn everywhere(&self, cmd: redis::Cmd) -> RedisResult<Value> {
        match self {
            Conn::Lean(_) => self.query(&cmd).await,
            Conn::Single(c, _) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c, _) => {
                c.clone()
                    .route_command(
                        cmd,
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await
            }
        }
    }
}

/// An error Redis answered, as redis-rs would classify it (`NOSCRIPT` must be recognised).
fn server_error(message: String) -> redis::RedisError {
    let kind = if message.starts_with("NOSCRIPT") {
        ErrorKind::Server(ServerErrorKind::NoScript)
    } else {
        ErrorKind::Extension
    };
    (kind, "Redis answered an error", message).into()
}

/// One attempt at floodgate's own connection to `target` (within [`CONNECT_TIMEOUT`] for the
/// TCP connection and [`HANDSHAKE_TIMEOUT`] for the handshake), or `None` when `target` is not
/// a `redis://` server.
pub(super) async fn connect_lean(target: &Target) -> Option<Result<RespConn, RespError>> {
    let Target::Single(client) = target else {
        return None;
    };
    let info = client.get_connection_info();
    let ConnectionAddr::Tcp(host, port) = info.addr() else {
        return None;
    };
    let settings = info.redis_settings();
    Some(
        RespConn::connect(
            host,
            *port,
            settings.username(),
            settings.password(),
            settings.db(),
            CONNECT_TIMEOUT,
            HANDSHAKE_TIMEOUT,
        )
        .await,
    )
}

/// A `PING` within [`HANDSHAKE_TIMEOUT`] (to any one node of a cluster: a dead master must not
/// keep the others from being served): a redis-rs connection is published only once replies
/// come on it.
async fn handshake(conn: &Conn) -> RedisResult<()> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, conn.query::<Value>(&redis::cmd("PING"))).await {
        Ok(reply) => reply.map(drop),
        Err(_) => Err((ErrorKind::Io, "Redis did not answer PING in time").into()),
    }
}

/// One connection attempt to `target`, unbounded (the caller bounds it).
pub(super) async fn connect(target: &Target) -> RedisResult<Conn> {
    match target {
        Target::Single(client) => {
            if let Some(made) = connect_lean(target).await {
                return made
                    .map(Conn::Lean)
                    .map_err(|e| (ErrorKind::Io, "cannot connect to Redis", e.to_string()).into());
            }
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                // Decisions have their own deadline (store.timeout); a response timeout here
                // would only fire after the caller stopped waiting.
                .set_response_timeout(None)
                // Reconnect quickly after Redis returns: few retries, short delays; the next
                // command starts another round if these fail.
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(100))
                .set_max_delay(Duration::from_secs(1))
                // Every request of the process queues on this connection.
                .set_pipeline_buffer_size(4096);
            let made = ConnectionManager::new_with_config((**client).clone(), config).await?;
            let conn = Conn::Single(made, Lost::default());
            handshake(&conn).await?;
            Ok(conn)
        }
        Target::Cluster(client, _) => {
            let made = client.get_async_connection().await?;
            let conn = Conn::Cluster(made, Lost::default());
            handshake(&conn).await?;
            Ok(conn)
        }
        Target::Broken(why) => Err((
            ErrorKind::InvalidClientConfig,
            "the Redis store could not be built",
            why.to_string(),
        )
            .into()),
    }
}
