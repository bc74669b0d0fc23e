//! The demo Orders API that floodgate's examples, `make run` and the tests put behind the
//! gateway.
//!
//! Endpoints: `GET /orders`, `GET /orders/{id}`, `POST /orders` (JSON), `GET /healthz`,
//! `POST /login` (JSON `{"password": "open-sesame"}` answers 200, anything else 401; `GET
//! /debug/logins` counts the attempts and failures it saw), an OpenAI-compatible `POST
//! /v1/chat/completions` (JSON, or server-sent events with `stream: true`; `?usage=header`
//! or `?usage=none` move or drop the usage), and for
//! tests `GET /debug/headers` (also the HTTP version it was asked with) and any other `GET /debug/...` (echo the path, query and request
//! headers they received). Any request may carry
//! `?delay_ms=N` (at most 60000) to make the answer slow. Every response carries
//! `x-served-by: <name>` so round robin can be seen.
//!
//! For the upstream tests: `--status N` answers every request but `GET /healthz` with status N
//! (a sick replica whose health check still passes); `--tls-cert PEM --tls-key PEM` serves TLS
//! (HTTP/2 by ALPN) instead of plain HTTP, and `--client-ca PEM` then requires a client
//! certificate signed by that CA (mTLS).
//!
//! `--capacity N` makes it a server of fixed capacity: N requests are served at once (each
//! holding its slot for its `delay_ms`), the rest wait inside it, as a real server's backlog
//! does; `GET /debug/load` answers how many requests are inside, the most there were
//! (`?reset=1` resets that peak) and how many came in since the start (`total`). With
//! `--shed` it answers what finds every slot taken `503` at once instead (a backend that sheds
//! its overload).
//!
//! Usage: `orders-api [--listen 127.0.0.1:9000] [--name orders-1] [--status N]
//! [--capacity N [--shed]] [--tls-cert PEM --tls-key PEM [--client-ca PEM]]`

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use http::{Response, StatusCode};
use parking_lot::Mutex;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::listening::Service;
use serde_json::{json, Value};

struct OrdersApi {
    name: String,
    /// `--status`: the status of every answer but `/healthz`.
    status: Option<StatusCode>,
    next_id: AtomicU64,
    orders: Mutex<BTreeMap<u64, Value>>,
    /// `POST /login` attempts seen, and how many of them failed (`GET /debug/logins`).
    logins: AtomicU64,
    failed_logins: AtomicU64,
    /// `--capacity`: the slots requests are served in.
    capacity: Option<std::sync::Arc<tokio::sync::Semaphore>>,
    /// `--shed`: a request that finds every slot taken is answered 503 at once.
    shed: bool,
    /// Requests inside (served or waiting), and the most there were.
    inside: AtomicU64,
    peak: AtomicU64,
    /// Requests that came in (but `/debug/load` itself).
    total: AtomicU64,
}

/// One request counted inside the server until dropped.
struct Inside<'a>(&'a AtomicU64);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The one password `POST /login` accepts (a demo: the point is the gateway counting failures).
const PASSWORD: &str = "open-sesame";

impl OrdersApi {
    fn new(name: String) -> Self {
        let mut orders = BTreeMap::new();
        orders.insert(
            1,
            json!({"id": 1, "item": "coffee beans", "quantity": 2, "status": "shipped"}),
        );
        orders.insert(
            2,
            json!({"id": 2, "item": "grinder", "quantity": 1, "status": "pending"}),
        );
        OrdersApi {
            name,
            status: None,
            next_id: AtomicU64::new(3),
            orders: Mutex::new(orders),
            logins: AtomicU64::new(0),
            failed_logins: AtomicU64::new(0),
            capacity: None,
            shed: false,
            inside: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }

    fn reply(&self, status: StatusCode, body: &Value) -> Response<Vec<u8>> {
        let body = serde_json::to_vec(body).unwrap_or_default();
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        if let Ok(v) = http::HeaderValue::from_str(&self.name) {
            h.insert("x-served-by", v);
        }
        let len = resp.body().len();
        resp.headers_mut()
            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
        resp
    }
}

impl OrdersApi {
    /// An OpenAI-compatible chat completion: the answer repeats "ok" `max_tokens` times (5 by
    /// default); prompt tokens are the words of the messages. `usage` says where the usage
    /// goes: `body` (in the JSON, or with `stream: true` in a last event before `[DONE]`, as
    /// OpenAI's `stream_options.include_usage` does), `header` (`x-usage-total-tokens`
    /// only) or `none`.
    fn chat_completion(&self, body: &[u8], usage: &str) -> Response<Vec<u8>> {
        let Ok(req) = serde_json::from_slice::<Value>(body) else {
            return self.reply(
                StatusCode::BAD_REQUEST,
                &json!({"error": {"message": "expected a JSON body", "type": "invalid_request_error"}}),
            );
        };
        let completion = req["max_tokens"].as_u64().unwrap_or(5).min(10_000);
        let prompt: u64 = req["messages"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .filter_map(|m| m["content"].as_str())
                    .map(|c| c.split_whitespace().count() as u64)
                    .sum()
            })
            .unwrap_or(0);
        let total = prompt + completion;
        let model = req["model"].as_str().unwrap_or("demo").to_owned();
        let counts = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total});
        let text = vec!["ok"; completion as usize].join(" ");
        let mut resp = if req["stream"].as_bool() == Some(true) {
            let mut out = String::new();
            let mut event = |v: Value| out.push_str(&format!("data: {v}\n\n"));
            for (i, word) in text.split(' ').enumerate() {
                let content = if i == 0 {
                    word.to_owned()
                } else {
                    format!(" {word}")
                };
                event(
                    json!({"id": "chatcmpl-demo", "object": "chat.completion.chunk", "created": 0,
                    "model": model, "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]}),
                );
            }
            event(
                json!({"id": "chatcmpl-demo", "object": "chat.completion.chunk", "created": 0,
                "model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            );
            if usage == "body" {
                event(
                    json!({"id": "chatcmpl-demo", "object": "chat.completion.chunk", "created": 0,
                    "model": model, "choices": [], "usage": counts}),
                );
            }
            out.push_str("data: [DONE]\n\n");
            let mut resp = self.reply(StatusCode::OK, &Value::Null);
            let len = out.len();
            *resp.body_mut() = out.into_bytes();
            let h = resp.headers_mut();
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
            h.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
            resp
        } else {
            let mut doc = json!({"id": "chatcmpl-demo", "object": "chat.completion", "created": 0,
                "model": model, "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": text}}]});
            if usage == "body" {
                doc["usage"] = counts;
            }
            self.reply(StatusCode::OK, &doc)
        };
        if usage == "header" {
            resp.headers_mut()
                .insert("x-usage-total-tokens", http::HeaderValue::from(total));
        }
        resp
    }
}

async fn read_body(session: &mut ServerSession) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > 1 << 20 {
                    return None;
                }
            }
            Ok(None) => return Some(body),
            Err(_) => return None,
        }
    }
}

#[async_trait]
impl ServeHttp for OrdersApi {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_string();
        let delay = query_param(req, "delay_ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map(|ms| ms.min(60_000));
        let headers = echoed(req);
        if path == "/debug/load" {
            let peak = if query_param(req, "reset").is_some() {
                self.peak.swap(0, Ordering::SeqCst)
            } else {
                self.peak.load(Ordering::SeqCst)
            };
            let inside = self.inside.load(Ordering::SeqCst);
            let total = self.total.load(Ordering::SeqCst);
            return self.reply(
                StatusCode::OK,
                &json!({"inside": inside, "peak": peak, "total": total}),
            );
        }
        self.total.fetch_add(1, Ordering::SeqCst);
        let n = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        let _inside = Inside(&self.inside);
        self.peak.fetch_max(n, Ordering::SeqCst);
        let _slot = match &self.capacity {
            Some(c) if self.shed => match c.clone().try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) => {
                    return self.reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &json!({"error": "over capacity", "path": path}),
                    )
                }
            },
            Some(c) => c.clone().acquire_owned().await.ok(),
            None => None,
        };
        if let Some(ms) = delay {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        if let Some(status) = self.status.filter(|_| segments.as_slice() != ["healthz"]) {
            return self.reply(
                status,
                &json!({"error": "answering --status", "path": path}),
            );
        }
        match (method.as_str(), segments.as_slice()) {
            ("GET", ["healthz"]) => self.reply(StatusCode::OK, &json!({"status": "ok"})),
            ("GET", ["debug", "headers"]) => {
                let version = format!("{:?}", req.version);
                self.reply(
                    StatusCode::OK,
                    &json!({"headers": headers, "path": path, "version": version}),
                )
            }
            ("GET", ["debug", "logins"]) => self.reply(
                StatusCode::OK,
                &json!({"attempts": self.logins.load(Ordering::Relaxed),
                        "failed": self.failed_logins.load(Ordering::Relaxed)}),
            ),
            // Any other GET under /debug/ echoes the path it was asked for (what the gateway
            // forwarded, after normalization).
            ("GET", ["debug", ..]) => self.reply(
                StatusCode::OK,
                &json!({"path": path, "query": req.uri.query(), "headers": headers,
                        "version": format!("{:?}", req.version)}),
            ),
            ("GET", ["orders"]) => {
                let list: Vec<Value> = self.orders.lock().values().cloned().collect();
                self.reply(StatusCode::OK, &json!({"orders": list}))
            }
            ("GET", ["orders", id]) => {
                let found = id
                    .parse::<u64>()
                    .ok()
                    .and_then(|id| self.orders.lock().get(&id).cloned());
                match found {
                    Some(order) => self.reply(StatusCode::OK, &order),
                    None => self.reply(StatusCode::NOT_FOUND, &json!({"error": "no such order"})),
                }
            }
            ("POST", ["login"]) => self.login(session).await,
            ("POST", ["v1", "chat", "completions"]) => {
                let usage = query_param(req, "usage").unwrap_or("body").to_owned();
                let body = read_body(session).await.unwrap_or_default();
                self.chat_completion(&body, &usage)
            }
            ("POST", ["orders"]) => self.create_order(session).await,
            ("GET", ["download"]) => download(query_param(req, "bytes")),
            // Reads a body of any size up to 16 MiB and says how many bytes came: an upload
            // sink for tests of slowed request bodies.
            ("POST", ["upload"]) => match count_body(session).await {
                Some(n) => self.reply(StatusCode::OK, &json!({"bytes": n})),
                None => self.reply(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": "body unreadable or over 16 MiB"}),
                ),
            },
            _ => self.reply(
                StatusCode::NOT_FOUND,
                &json!({"error": "not found", "path": path}),
            ),
        }
    }
}

impl OrdersApi {
    /// `POST /login`: 200 and a token for the demo password, 401 for anything else; both
    /// counted (`GET /debug/logins`), so that tests see what reached the upstream.
    async fn login(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        self.logins.fetch_add(1, Ordering::Relaxed);
        let body = read_body(session).await.unwrap_or_default();
        let password = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("password").and_then(Value::as_str).map(str::to_owned));
        if password.as_deref() == Some(PASSWORD) {
            self.reply(StatusCode::OK, &json!({"token": "demo-session"}))
        } else {
            self.failed_logins.fetch_add(1, Ordering::Relaxed);
            self.reply(
                StatusCode::UNAUTHORIZED,
                &json!({"error": "wrong user or password"}),
            )
        }
    }

    /// `POST /orders`: stores the JSON object with a new id and `status` pending unless given.
    async fn create_order(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let Some(body) = read_body(session).await else {
            return self.reply(
                StatusCode::BAD_REQUEST,
                &json!({"error": "body unreadable or over 1 MiB"}),
            );
        };
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(mut order)) => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                order.insert("id".into(), json!(id));
                order.entry("status").or_insert(json!("pending"));
                let order = Value::Object(order);
                self.orders.lock().insert(id, order.clone());
                self.reply(StatusCode::CREATED, &order)
            }
            _ => self.reply(
                StatusCode::BAD_REQUEST,
                &json!({"error": "expected a JSON object"}),
            ),
        }
    }
}

/// `GET /download?bytes=N`: N bytes of `x` (at most 16 MiB), for tests of slowed responses.
fn download(bytes: Option<&str>) -> Response<Vec<u8>> {
    let n = bytes
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0)
        .min(MAX_TRANSFER);
    let mut resp = Response::new(vec![b'x'; n]);
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(n));
    resp
}

/// The value of query parameter `name`, as sent.
fn query_param<'a>(req: &'a pingora::http::RequestHeader, name: &str) -> Option<&'a str> {
    req.uri
        .query()?
        .split('&')
        .find_map(|p| p.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')))
}

/// The request's headers as the debug endpoints echo them: a header sent more than once is
/// echoed once, its values joined with ", " (so that a test can see a duplicate).
fn echoed(req: &pingora::http::RequestHeader) -> BTreeMap<String, String> {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in req.headers.iter() {
        let v = String::from_utf8_lossy(v.as_bytes());
        headers
            .entry(k.as_str().to_string())
            .and_modify(|e| {
                e.push_str(", ");
                e.push_str(&v);
            })
            .or_insert_with(|| v.into_owned());
    }
    headers
}

/// The largest `/download` and `/upload`.
const MAX_TRANSFER: usize = 16 << 20;

/// Reads a request body to its end, keeping only its length.
async fn count_body(session: &mut ServerSession) -> Option<usize> {
    let mut n = 0;
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                n += chunk.len();
                if n > MAX_TRANSFER {
                    return None;
                }
            }
            Ok(None) => return Some(n),
            Err(_) => return None,
        }
    }
}

fn main() {
    let mut listen = "127.0.0.1:9000".to_string();
    let mut name = "orders-api".to_string();
    let mut status = None;
    let mut capacity = None;
    let mut shed = false;
    let (mut tls_cert, mut tls_key, mut client_ca) = (None, None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().unwrap_or(listen),
            "--name" => name = args.next().unwrap_or(name),
            "--status" => {
                status = args
                    .next()
                    .and_then(|s| s.parse::<u16>().ok())
                    .and_then(|s| StatusCode::from_u16(s).ok());
            }
            "--capacity" => {
                capacity = args
                    .next()
                    .and_then(|s| s.parse::<usize>().ok())
                    .filter(|n| (1..=100_000).contains(n));
            }
            "--shed" => shed = true,
            "--tls-cert" => tls_cert = args.next(),
            "--tls-key" => tls_key = args.next(),
            "--client-ca" => client_ca = args.next(),
            "-h" | "--help" => {
                println!("usage: orders-api [--listen 127.0.0.1:9000] [--name NAME]");
                return;
            }
            other => {
                eprintln!("orders-api: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let conf = ServerConf {
        threads: 2,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        pid_file: format!("/tmp/orders-api-{}.pid", std::process::id()),
        upgrade_sock: format!("/tmp/orders-api-{}.sock", std::process::id()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut api = OrdersApi::new(name);
    api.status = status;
    api.capacity = capacity.map(|n| std::sync::Arc::new(tokio::sync::Semaphore::new(n)));
    api.shed = shed;
    let mut service = Service::new("orders api".to_string(), api);
    match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => {
            let mut settings = pingora::listeners::tls::TlsSettings::intermediate(&cert, &key)
                .unwrap_or_else(|e| {
                    eprintln!("orders-api: cannot load the TLS certificate or key: {e}");
                    std::process::exit(2);
                });
            settings.enable_h2();
            if let Some(ca) = client_ca {
                pingora::tls::install_default_crypto_provider();
                let mut roots = pingora::tls::RootCertStore::empty();
                let verifier = pingora::tls::load_ca_file_into_store(&ca, &mut roots)
                    .ok()
                    .and_then(|()| {
                        pingora::tls::WebPkiClientVerifier::builder(std::sync::Arc::new(roots))
                            .build()
                            .ok()
                    })
                    .unwrap_or_else(|| {
                        eprintln!("orders-api: cannot use --client-ca {ca}");
                        std::process::exit(2);
                    });
                settings.set_client_cert_verifier(verifier);
            }
            service.add_tls_with_settings(&listen, None, settings);
        }
        _ => service.add_tcp(&listen),
    }
    server.add_service(service);
    eprintln!("orders-api listening on {listen}");
    server.run_forever();
}
