//! `[tracing]` end to end: the binary exports its spans to a real OTLP receiver (the
//! collector's own generated gRPC service, `opentelemetry-proto`, inside this test binary, and
//! an OTLP/HTTP endpoint decoding the same protobuf messages), and the demo Orders API echoes
//! the `traceparent` it received.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::redis::RedisServer;
use common::{client, eventually, free_addr, metric_value, orders_upstream, Gateway, OrdersApi};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The client's trace and span ids in the tests' `traceparent`.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// Server, internal, client span kinds (OTLP `Span.SpanKind`).
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

/// One received span, flattened.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    resource: BTreeMap<String, String>,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    kind: i32,
    attributes: BTreeMap<String, String>,
    events: Vec<(String, BTreeMap<String, String>)>,
}

impl Got {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// Every span the receivers were sent.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Got>>>);

impl Received {
    fn take(&self, req: ExportTraceServiceRequest) {
        let mut all = self.0.lock().unwrap();
        for rs in req.resource_spans {
            let resource = rs
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    all.push(Got {
                        service: service.clone(),
                        resource: resource.clone(),
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        name: s.name.clone(),
                        kind: s.kind,
                        attributes: attributes(&s.attributes),
                        events: s
                            .events
                            .iter()
                            .map(|e| (e.name.clone(), attributes(&e.attributes)))
                            .collect(),
                    });
                }
            }
        }
    }

    fn spans(&self) -> Vec<Got> {
        self.0.lock().unwrap().clone()
    }

    /// Waits for a span that `pick` accepts.
    async fn wait_for(&self, what: &str, pick: impl Fn(&Got) -> bool) -> Got {
        eventually(Duration::from_secs(20), what, || {
            let found = self.spans().into_iter().find(|s| pick(s));
            async move { found }
        })
        .await
    }

    /// Waits for the server span of trace `trace`.
    async fn server_span(&self, what: &str, trace: &str) -> Got {
        self.wait_for(what, |s| s.kind == SERVER && s.trace_id == trace)
            .await
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.take(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running OTLP/gRPC receiver; stops when dropped.
struct Collector {
    addr: SocketAddr,
    received: Received,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Collector {
    async fn start() -> Collector {
        let addr = free_addr();
        let received = Received::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = TraceServiceServer::new(received.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_shutdown(addr, async {
                    let _ = stopped.await;
                })
                .await
                .expect("the OTLP receiver serves");
        });
        eventually(
            Duration::from_secs(10),
            "the OTLP receiver listens",
            || async move { tokio::net::TcpStream::connect(addr).await.ok() },
        )
        .await;
        Collector {
            addr,
            received,
            stop: Some(stop),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `[tracing]` lines that export to this receiver at `ratio`.
    fn exporting(&self, ratio: f64) -> String {
        format!(
            "otlp_endpoint = \"{}\"\nsample_ratio = {ratio:?}",
            self.endpoint()
        )
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// An OTLP/HTTP receiver (`POST /v1/traces`, protobuf bodies) on a plain socket; the task
/// ends with the test's runtime.
async fn http_collector() -> (SocketAddr, Received) {
    http_collector_answering(Answer::Empty).await
}

/// How an OTLP/HTTP receiver answers an export.
#[derive(Clone, Copy)]
enum Answer {
    /// `200` with an empty body, the connection kept alive.
    Empty,
    /// `200` with a chunked body that never ends (a broken or hostile collector).
    Endless,
}

/// [`http_collector`] answering as `answer` says.
async fn http_collector_answering(answer: Answer) -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let r = received.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let r = r.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request at a time on a kept-alive connection: head, then its body.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 8192];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        let mut chunk = [0u8; 8192];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Vec<u8> = buf.drain(..head_end + len).skip(head_end).collect();
                    if head.starts_with("post /v1/traces ") {
                        if let Ok(req) = ExportTraceServiceRequest::decode(&body[..]) {
                            r.take(req);
                        }
                    }
                    if let Answer::Endless = answer {
                        let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ntransfer-encoding: chunked\r\n\r\n";
                        let mut chunk = b"4000\r\n".to_vec();
                        chunk.extend(std::iter::repeat_n(b'x', 0x4000));
                        chunk.extend_from_slice(b"\r\n");
                        if conn.write_all(head).await.is_err() {
                            return;
                        }
                        // Until the exporter lets go of the connection.
                        while conn.write_all(&chunk).await.is_ok() {}
                        return;
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if conn.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, received)
}

/// A gateway in front of `api` with `tracing` as its `[tracing]` body and `rules` after the
/// route (`/debug` echoes the request headers); `trusted` is `[server] trusted_proxies`.
/// Exports every 50 ms unless `tracing` sets its own `schedule_delay`.
fn start(api: &OrdersApi, trusted: &str, tracing: &str, rules: &str) -> Gateway {
    let delay = match tracing.contains("schedule_delay") {
        true => "",
        false => "schedule_delay = \"50ms\"",
    };
    Gateway::start_with(
        &format!("trusted_proxies = [{trusted}]\n"),
        &format!(
            "{}
[[routes]]
name = \"debug\"
match = {{ path_prefix = \"/debug\" }}
upstream = \"orders\"
auth = \"none\"

{rules}

[tracing]
{delay}
{tracing}
",
            orders_upstream(&[api.addr])
        ),
        &[],
    )
}

/// A gateway, in front of the Orders API, that exports to a collector of its own. Tests take it
/// apart; a part they do not use is bound to `_name`, not `..`, which would drop it (and stop
/// the API) at once.
struct Traced {
    gw: Gateway,
    collector: Collector,
    api: OrdersApi,
}

/// The Orders API, a collector and [`start`]'s gateway exporting to it at `ratio` (`tracing`:
/// more `[tracing]` lines).
async fn traced(trusted: &str, ratio: f64, tracing: &str, rules: &str) -> Traced {
    let api = OrdersApi::start("orders-1");
    let collector = Collector::start().await;
    let gw = start(
        &api,
        trusted,
        &format!("{}\n{tracing}", collector.exporting(ratio)),
        rules,
    );
    Traced { gw, collector, api }
}

/// A GET of `path` from a caller in trace `trace` (`flags`: `01` sampled, `00` not).
fn in_trace(gw: &Gateway, path: &str, trace: &str, flags: &str) -> reqwest::RequestBuilder {
    client()
        .get(gw.url(path))
        .header("traceparent", format!("00-{trace}-{PARENT}-{flags}"))
}

/// The `traceparent` the upstream received, from the echo's JSON.
async fn upstream_traceparent(r: reqwest::Response) -> Option<String> {
    let body: serde_json::Value = r.json().await.unwrap();
    body["headers"]["traceparent"].as_str().map(str::to_string)
}

#[tokio::test]
async fn a_trusted_callers_trace_is_continued_and_the_upstream_gets_floodgates_span_as_parent() {
    // sample_ratio 0: what is exported is there only because the caller's sampled flag was
    // followed (parent-based).
    let Traced { gw, collector, api } = traced(
        "\"127.0.0.1/32\"",
        0.0,
        "service_name = \"edge-gw\"\nresource_attributes = { \"deployment.environment\" = \"test\" }",
        "",
    )
    .await;
    let r = in_trace(&gw, "/debug/orders/1", TRACE, "01")
        .header("tracestate", "vendor=abc")
        .header("x-request-id", "req-trace-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sent = upstream_traceparent(r)
        .await
        .expect("the upstream got a traceparent");
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts.len(), 4, "{sent}");
    assert_eq!(
        parts[1], TRACE,
        "the upstream is in the caller's trace: {sent}"
    );
    assert_ne!(
        parts[2], PARENT,
        "the upstream's parent is floodgate's span: {sent}"
    );
    assert_eq!(parts[3], "01", "sampled: {sent}");

    let rx = &collector.received;
    let server = rx.server_span("the server span", TRACE).await;
    assert_eq!(
        server.parent, PARENT,
        "the server span continues the caller's"
    );
    assert_eq!(server.service, "edge-gw");
    assert_eq!(server.name, "GET debug");
    assert_eq!(server.attr("http.request.method"), Some("GET"));
    assert_eq!(server.attr("http.route"), Some("debug"));
    assert_eq!(server.attr("url.path"), Some("/debug/orders/1"));
    assert_eq!(server.attr("http.response.status_code"), Some("200"));
    assert_eq!(server.attr("client.address"), Some("127.0.0.1"));
    let upstream = rx
        .wait_for("the upstream client span", |s| {
            s.kind == CLIENT && s.trace_id == TRACE && s.name == "GET"
        })
        .await;
    assert_eq!(
        upstream.span_id, parts[2],
        "the upstream's traceparent names the client span"
    );
    assert_eq!(
        upstream.parent, server.span_id,
        "the client span is the server span's child"
    );
    assert_eq!(upstream.attr("floodgate.upstream"), Some("orders"));
    // What the upstream received (a route's rewrite would show here, the client's path on the
    // server span).
    assert_eq!(upstream.attr("url.path"), Some("/debug/orders/1"));
    assert_eq!(
        upstream.attr("server.port"),
        Some(api.addr.port().to_string().as_str())
    );
    assert_eq!(upstream.attr("http.response.status_code"), Some("200"));
    assert_eq!(
        server
            .resource
            .get("deployment.environment")
            .map(String::as_str),
        Some("test"),
        "{:?}",
        server.resource
    );
    let resource = |k: &str| server.resource.get(k).map(String::as_str);
    assert_eq!(resource("telemetry.sdk.name"), Some("floodgate"));
    assert_eq!(resource("telemetry.sdk.language"), Some("rust"));
    assert_eq!(resource("service.version"), Some(env!("CARGO_PKG_VERSION")));

    // The request id and the trace id on one access line.
    let line = eventually(Duration::from_secs(10), "the access line", || {
        let logs = gw.logs();
        async move {
            logs.lines()
                .find(|l| l.contains("req-trace-1"))
                .map(str::to_string)
        }
    })
    .await;
    assert!(line.contains(&format!("trace_id={TRACE}")), "{line}");

    // An unsampled caller is not sampled (ratio 0 would not sample it either way) but its
    // trace still goes upstream.
    let r = in_trace(&gw, "/debug/x", &"1".repeat(32), "00")
        .send()
        .await
        .unwrap();
    let sent = upstream_traceparent(r).await.unwrap();
    assert!(
        sent.starts_with(&format!("00-{}-", "1".repeat(32))),
        "{sent}"
    );
    assert!(sent.ends_with("-00"), "{sent}");
}

#[tokio::test]
async fn an_untrusted_clients_traceparent_is_not_continued() {
    // No trusted proxies: the loopback client is untrusted. Its sampled traceparent must not
    // force sampling (ratio 0), nor pick the trace id.
    let Traced { gw, collector, api } = traced("", 0.0, "", "").await;
    let r = in_trace(&gw, "/debug/a", TRACE, "01")
        .header("tracestate", "evil=1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    let sent = body["headers"]["traceparent"].as_str().unwrap().to_string();
    assert!(
        !sent.contains(TRACE),
        "a fresh trace, not the client's: {sent}"
    );
    assert!(
        sent.ends_with("-00"),
        "the client cannot force sampling: {sent}"
    );
    assert!(body["headers"].get("tracestate").is_none(), "{body}");

    // With ratio 1 the fresh trace is exported, as a root.
    let gw = start(&api, "", &collector.exporting(1.0), "");
    let r = in_trace(&gw, "/debug/b", TRACE, "01").send().await.unwrap();
    let sent = upstream_traceparent(r).await.unwrap();
    let trace = sent.split('-').nth(1).unwrap().to_string();
    assert_ne!(trace, TRACE);
    let server = collector
        .received
        .server_span("the server span", &trace)
        .await;
    assert_eq!(server.parent, "", "a root span");
    assert!(
        collector
            .received
            .spans()
            .iter()
            .all(|s| s.trace_id != TRACE),
        "nothing in the client's trace"
    );
}

#[tokio::test]
async fn a_rejected_request_is_a_complete_trace_naming_its_rule() {
    let Traced { gw, collector, api: _api } = traced(
        "\"127.0.0.1/32\"",
        1.0,
        "",
        "[[rules]]\nname = \"one-per-ip\"\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\n",
    )
    .await;
    let first = client().get(gw.url("/debug/1")).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let trace = "a".repeat(32);
    let second = in_trace(&gw, "/debug/2", &trace, "01")
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 429);
    let rx = &collector.received;
    let server = rx.server_span("the 429's server span", &trace).await;
    assert_eq!(server.attr("http.response.status_code"), Some("429"));
    assert_eq!(server.attr("floodgate.rejected_by"), Some("one-per-ip"));
    let admission = rx
        .wait_for("the admission span", |s| {
            s.trace_id == trace && s.name == "floodgate.admission"
        })
        .await;
    assert_eq!(admission.parent, server.span_id);
    assert_eq!(admission.attr("floodgate.decision.result"), Some("reject"));
    assert_eq!(admission.attr("floodgate.rejected_by"), Some("one-per-ip"));
    assert_eq!(admission.attr("floodgate.rules"), Some("one-per-ip"));
    let (name, rule) = &admission.events[0];
    assert_eq!(name, "floodgate.rule");
    assert_eq!(
        rule.get("floodgate.rule.name").map(String::as_str),
        Some("one-per-ip")
    );
    assert_eq!(
        rule.get("floodgate.rule.result").map(String::as_str),
        Some("rejected")
    );
    assert_eq!(
        rule.get("floodgate.rule.remaining").map(String::as_str),
        Some("0")
    );
    // Answered at the edge: no upstream exchange in that trace.
    assert!(
        !rx.spans()
            .iter()
            .any(|s| s.trace_id == trace && s.kind == CLIENT),
        "{:?}",
        rx.spans()
    );
    // The admitted request's admission span says so.
    rx.wait_for("the first request's admission", |s| {
        s.name == "floodgate.admission" && s.attr("floodgate.decision.result") == Some("allow")
    })
    .await;
}

#[tokio::test]
async fn the_store_call_is_a_child_of_the_admission_span() {
    let redis = RedisServer::start();
    let Traced { gw, collector, api: _api } = traced(
        "\"127.0.0.1/32\"",
        1.0,
        "",
        &format!(
            "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\n\n[[rules]]\nname = \"global-per-ip\"\nkey = [\"ip\"]\nalgorithm = \"sliding_window_log\"\nlimit = 100\nwindow = \"1m\"\nscope = \"global\"\n",
            redis.url()
        ),
    )
    .await;
    // The store connects in the background: the first requests may be decided by the
    // fallback; wait for one the store answered.
    let trace = "b".repeat(32);
    let store = eventually(Duration::from_secs(20), "a traced store call", || {
        let (call, rx, trace) = (
            in_trace(&gw, "/debug/s", &trace, "01"),
            collector.received.clone(),
            trace.clone(),
        );
        async move {
            let r = call.send().await.ok()?;
            assert_eq!(r.status(), 200);
            tokio::time::sleep(Duration::from_millis(200)).await;
            rx.spans()
                .into_iter()
                .find(|s| s.trace_id == trace && s.name == "floodgate.store" && s.kind == CLIENT)
        }
    })
    .await;
    let admission = collector
        .received
        .wait_for("its admission span", |s| s.span_id == store.parent)
        .await;
    assert_eq!(admission.name, "floodgate.admission");
    assert_eq!(admission.attr("floodgate.store.calls"), Some("1"));
    assert_eq!(store.attr("db.system.name"), Some("redis"));
}

#[tokio::test]
async fn spans_go_to_an_otlp_http_endpoint_by_its_path() {
    let api = OrdersApi::start("orders-1");
    let (addr, received) = http_collector().await;
    let gw = start(
        &api,
        "\"127.0.0.1/32\"",
        &format!("otlp_endpoint = \"http://{addr}/v1/traces\"\nsample_ratio = 1.0"),
        "",
    );
    let r = in_trace(&gw, "/debug/h", TRACE, "01").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let server = received
        .server_span("the server span over OTLP/HTTP", TRACE)
        .await;
    assert_eq!(server.service, "floodgate", "the default service name");
}

#[tokio::test]
async fn a_collector_whose_answer_never_ends_holds_no_export() {
    let api = OrdersApi::start("orders-1");
    let (addr, received) = http_collector_answering(Answer::Endless).await;
    let gw = start(
        &api,
        "",
        &format!(
            "otlp_endpoint = \"http://{addr}/v1/traces\"\nsample_ratio = 1.0\nexport_timeout = \"60s\""
        ),
        "",
    );
    // Each request's two spans go in an export of their own (50 ms apart): the second export
    // happens within the test only if the first stopped reading its endless answer at the
    // cap, not at the minute's timeout.
    let spans = || received.spans().len();
    all_answered(&gw, 1).await;
    eventually(Duration::from_secs(10), "the first export", || async {
        (spans() >= 2).then_some(())
    })
    .await;
    all_answered(&gw, 1).await;
    eventually(Duration::from_secs(10), "a second export", || async {
        (spans() >= 4).then_some(())
    })
    .await;
    assert_eq!(
        dropped(&gw).await,
        Some(0.0),
        "an answer past the cap is no failure"
    );
}

/// Sends `n` requests and asserts each gets the echo's 200 with its own path.
async fn all_answered(gw: &Gateway, n: usize) {
    let c = client();
    for i in 0..n {
        let r = c.get(gw.url(&format!("/debug/d{i}"))).send().await.unwrap();
        assert_eq!(r.status(), 200, "request {i}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["path"], format!("/debug/d{i}"), "request {i}");
    }
}

async fn dropped(gw: &Gateway) -> Option<f64> {
    let text = client()
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    metric_value(&text, "floodgate_trace_spans_dropped_total")
}

#[tokio::test]
async fn a_stopped_collector_changes_no_answer_and_counts_drops() {
    let api = OrdersApi::start("orders-1");
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    // Nothing listens there any more: every export fails.
    drop(collector);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let gw = start(
        &api,
        "",
        &format!("otlp_endpoint = \"{endpoint}\"\nsample_ratio = 1.0\nexport_timeout = \"1s\""),
        "",
    );
    assert_eq!(dropped(&gw).await, Some(0.0));
    all_answered(&gw, 20).await;
    eventually(
        Duration::from_secs(20),
        "failed exports counted as drops",
        || async { dropped(&gw).await.filter(|n| *n >= 1.0) },
    )
    .await;
}

#[tokio::test]
async fn a_collector_that_never_answers_holds_no_request_and_the_full_queue_drops() {
    let api = OrdersApi::start("orders-1");
    // Accepts connections and never reads or answers: an export waits its whole timeout.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = hole.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = hole.accept().await {
            h.lock().unwrap().push(conn);
        }
    });
    // A queue of 4 and an export that hangs for a minute: the first batch hangs, the queue
    // fills, and every span after that is dropped at once.
    let gw = start(
        &api,
        "",
        &format!(
            "otlp_endpoint = \"http://{addr}\"\nsample_ratio = 1.0\nexport_timeout = \"60s\"\nmax_queue_size = 4\nmax_export_batch_size = 2"
        ),
        "",
    );
    all_answered(&gw, 30).await;
    // 30 requests make 60 spans (server + upstream); at most 4 queued and 2 in the hung export.
    let n = eventually(Duration::from_secs(10), "drops of a full queue", || async {
        dropped(&gw).await.filter(|n| *n >= 54.0)
    })
    .await;
    assert!(n <= 60.0, "{n}");
}

#[tokio::test]
async fn a_queue_past_half_full_is_exported_before_its_schedule() {
    let api = OrdersApi::start("orders-1");
    let collector = Collector::start().await;
    // An hour between scheduled exports and a queue of 64: only the wake-up of a queue past
    // half full (32 spans, the 16th request) can export anything within the test.
    let gw = start(
        &api,
        "",
        &format!(
            "{}\nschedule_delay = \"1h\"\nmax_queue_size = 64",
            collector.exporting(1.0)
        ),
        "",
    );
    all_answered(&gw, 40).await;
    let rx = &collector.received;
    eventually(
        Duration::from_secs(10),
        "spans exported before the schedule",
        || async { (rx.spans().len() >= 32).then_some(()) },
    )
    .await;
    // One request at a time never fills the queue: nothing was dropped.
    assert_eq!(dropped(&gw).await, Some(0.0));
}

#[tokio::test]
async fn the_rls_port_continues_envoys_trace_and_records_its_decision() {
    use common::rls::{descriptor, request, RlsGateway};
    let collector = Collector::start().await;
    let (rls, admin) = (free_addr(), free_addr());
    let gw = RlsGateway::start_config(
        &format!(
            "[server]\nadmin_listen = \"{admin}\"\nthreads = 1\ngrace_period = \"1s\"\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n\
             [rls]\nlisten = \"{rls}\"\n\n\
             [[rls.limits]]\nname = \"edge-per-user\"\ndomain = \"edge\"\ndescriptor = [{{ key = \"user\" }}]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\n\n\
             [tracing]\notlp_endpoint = \"{}\"\nsample_ratio = 0.0\nschedule_delay = \"50ms\"\n",
            collector.endpoint()
        ),
        rls,
        admin,
    );
    let mut c = gw.client().await;
    let trace = "c".repeat(32);
    for _ in 0..2 {
        let mut call = tonic::Request::new(request("edge", vec![descriptor(&[("user", "alice")])]));
        call.metadata_mut().insert(
            "traceparent",
            format!("00-{trace}-{PARENT}-01").parse().unwrap(),
        );
        c.should_rate_limit(call).await.expect("answered");
    }
    let rx = &collector.received;
    let over = rx
        .wait_for("the over-limit call's server span", |s| {
            s.kind == SERVER
                && s.trace_id == trace
                && s.attr("floodgate.rls.overall_code") == Some("OVER_LIMIT")
        })
        .await;
    assert_eq!(over.parent, PARENT, "Envoy's span is the parent");
    assert_eq!(over.attr("rpc.method"), Some("ShouldRateLimit"));
    assert_eq!(over.attr("floodgate.rejected_by"), Some("edge-per-user"));
    let decision = rx
        .wait_for("its decision span", |s| {
            s.parent == over.span_id && s.name == "floodgate.admission"
        })
        .await;
    assert_eq!(decision.attr("floodgate.decision.result"), Some("reject"));
    assert_eq!(
        decision.events[0]
            .1
            .get("floodgate.rule.name")
            .map(String::as_str),
        Some("edge-per-user")
    );
}

#[tokio::test]
async fn sample_ratio_and_trust_are_reloaded_and_the_exporters_keys_wait_for_a_restart() {
    let Traced {
        gw,
        collector,
        api: _api,
    } = traced("", 0.0, "", "").await;
    let c = client();
    let trace_of = |r: Option<String>| r.unwrap().split('-').nth(1).unwrap().to_string();
    let r = c.get(gw.url("/debug/before")).send().await.unwrap();
    let before = trace_of(upstream_traceparent(r).await);
    assert!(
        upstream_traceparent(c.get(gw.url("/debug/x")).send().await.unwrap())
            .await
            .unwrap()
            .ends_with("-00"),
        "ratio 0: not sampled"
    );

    // Ratio 1, the client trusted, and a new service name (restart-only) in one reload.
    let path = gw.dir.path().join("gateway.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replace(
        "sample_ratio = 0.0",
        "sample_ratio = 1.0\ntrust_incoming = true\nservice_name = \"renamed\"",
    );
    std::fs::write(&path, text).unwrap();
    let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let status: serde_json::Value = r.json().await.unwrap();
    assert!(
        status.to_string().contains("tracing.service_name"),
        "the restart-only change is reported: {status}"
    );
    let trace = "d".repeat(32);
    let sent = upstream_traceparent(
        in_trace(&gw, "/debug/after", &trace, "00")
            .send()
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        trace_of(Some(sent.clone())),
        trace,
        "trust_incoming took effect: {sent}"
    );
    // The caller's unsampled flag is followed (parent-based), whatever the ratio...
    assert!(sent.ends_with("-00"), "{sent}");
    // ...and a new trace is sampled at the new ratio.
    let r = c.get(gw.url("/debug/fresh")).send().await.unwrap();
    let fresh = trace_of(upstream_traceparent(r).await);
    let server = collector
        .received
        .server_span("a span at the reloaded ratio", &fresh)
        .await;
    assert_eq!(
        server.service, "floodgate",
        "the exporter keeps its start-up service name"
    );
    assert!(collector
        .received
        .spans()
        .iter()
        .all(|s| s.trace_id != before && s.trace_id != trace));
}
