//! What every generated server shares: the listener (loopback unless told otherwise, a graceful
//! stop on SIGTERM), OpenAI error objects, request bodies read as JSON objects, the API key,
//! and the counters and histograms of `GET /metrics`.

use std::fmt::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use crate::{Error, MAX_BODY_BYTES, WORKLOAD};

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct Options {
    /// Model directory: what `serve --model` reads.
    pub model: PathBuf,
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    /// When set, `/v1/` routes want `Authorization: Bearer` this key.
    pub api_key: Option<String>,
}

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Model(#[from] Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The chat template built into the crate (`serving.chat.template`) does not compile.
    #[only_if(chat)]
    #[error("the chat template of this crate (its workload's serving.chat.template) does not compile: {0}")]
    ChatTemplate(String),
    #[error("cannot start the server's runtime: {0}")]
    Runtime(std::io::Error),
}

/// The HTTP side of a running server: its runtime, its address, and the way to stop taking
/// connections.
pub struct Listener {
    addr: SocketAddr,
    pub runtime: tokio::runtime::Runtime,
    shutdown: Option<oneshot::Sender<()>>,
    serving: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Listener {
    /// Listens on `host:port` (port 0 picks a free one) and serves `app` on two threads.
    pub fn bind(host: &str, port: u16, app: Router) -> Result<Listener, ServeError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("http")
            .enable_all()
            .build()
            .map_err(ServeError::Runtime)?;
        let addr = format!("{host}:{port}");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(&addr))
            .map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Bind { addr, source })?;
        let (shutdown, stopped) = oneshot::channel::<()>();
        let serving = runtime.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Listener { addr, runtime, shutdown: Some(shutdown), serving: Some(serving) })
    }

    /// The address it listens on (the port chosen, where 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the process gets SIGTERM or SIGINT (Ctrl-C).
    pub fn wait_for_signal(&self) {
        self.runtime.block_on(async {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{SignalKind, signal};
                let (Ok(mut term), Ok(mut int)) =
                    (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
                else {
                    return std::future::pending().await;
                };
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
            }
        });
    }

    /// Stops taking connections, and returns when every request taken has been answered.
    pub fn stop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(serving) = self.serving.take() {
            let _ = self.runtime.block_on(serving);
        }
    }
}

/// An answer with an OpenAI error object.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400, naming the request field that is wrong.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param), code: None }
    }

    /// 400, about the request as a whole.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: None, code: None }
    }

    /// 500: the server failed, not the request.
    pub fn server(reason: impl ToString) -> ApiError {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message: reason.to_string(), param: None, code: None }
    }

    /// 429 with `Retry-After`: every place in the queue is taken.
    pub fn queue_full() -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: "the server is at capacity: retry later".into(),
            param: None,
            code: Some("queue_full"),
        }
    }

    /// 503 with `Retry-After`: the server is stopping.
    pub fn stopping() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down".into(),
            param: None,
            code: None,
        }
    }

    /// The error object's `type`.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": { "message": self.message, "type": self.kind(), "param": self.param, "code": self.code }
        });
        let mut response = (self.status, json_headers(), body.to_string()).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS || self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

pub fn json_headers() -> [(header::HeaderName, HeaderValue); 1] {
    [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))]
}

pub fn json_response(value: &Value) -> Response {
    (StatusCode::OK, json_headers(), value.to_string()).into_response()
}

pub async fn not_found() -> Response {
    ApiError { status: StatusCode::NOT_FOUND, message: "no such route".into(), param: None, code: None }
        .into_response()
}

pub async fn method_not_allowed() -> Response {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: "this route does not take that method".into(),
        param: None,
        code: None,
    }
    .into_response()
}

/// `GET /health`: 200 while serving, 503 once stopping.
pub fn health(stopping: bool) -> Response {
    let (code, status) = if stopping { (StatusCode::SERVICE_UNAVAILABLE, "stopping") } else { (StatusCode::OK, "ok") };
    (code, json_headers(), json!({ "status": status }).to_string()).into_response()
}

/// `GET /metrics`: Prometheus text.
pub fn metrics_text(text: String) -> Response {
    let headers = [(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"))];
    (StatusCode::OK, headers, text).into_response()
}

/// `GET /v1/models`: the one model this server serves.
pub fn models(created: u64) -> Response {
    json_response(&json!({
        "object": "list",
        "data": [{ "id": WORKLOAD, "object": "model", "created": created, "owned_by": "monogen" }],
    }))
}

/// Lets a request through where the server has no key, or where it sends the key.
pub fn authorize(api_key: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = api_key else { return Ok(()) };
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if given.map(str::trim) == Some(key) {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: if given.is_some() { "the API key is wrong".into() } else { "an API key is needed: send `Authorization: Bearer KEY`".into() },
        param: None,
        code: Some("invalid_api_key"),
    })
}

/// The answer to a body larger than the server reads.
fn too_large() -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("the request body is larger than {MAX_BODY_BYTES} bytes (serving.max_body_bytes)"),
        param: None,
        code: None,
    }
}

/// Answers 413 at once to a request whose `Content-Length` declares a body larger than the
/// server reads, before reading any of it (the connection then closes). The body limit alone
/// refuses such a body only once that much of it has arrived, and a client that declares more
/// than it sends would hold the connection meanwhile.
pub async fn refuse_declared_oversize(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large().into_response();
    }
    next.run(request).await
}

/// The body as a JSON object.
pub fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return too_large();
        }
        ApiError { status: rejection.status(), message: format!("cannot read the request body: {rejection}"), param: None, code: None }
    })?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad(format!("the request body is not valid JSON: {e}"))),
    }
}

/// Refuses a field `fields` does not name, and a `model` other than this server's.
pub fn check_fields_and_model(body: &Map<String, Value>, fields: &[&str]) -> Result<(), ApiError> {
    if let Some(unknown) = body.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(ApiError::bad(format!("unrecognized request argument supplied: `{unknown}`")));
    }
    let model = match body.get("model") {
        Some(Value::String(model)) => model,
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
        None => return Err(ApiError::invalid("model", format!("`model` is required: this server serves `{WORKLOAD}`"))),
    };
    if model != WORKLOAD {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{model}` does not exist: this server serves `{WORKLOAD}`"),
            param: Some("model"),
            code: Some("model_not_found"),
        });
    }
    if let Some(user) = body.get("user")
        && !user.is_string()
    {
        return Err(ApiError::invalid("user", "`user` must be a string"));
    }
    Ok(())
}

/// Upper bounds of the latency histograms' buckets, in seconds.
const BUCKETS: [f64; 14] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];

/// A latency histogram: counts per bucket (the last one above every bound), and the sum.
pub struct Histogram {
    counts: Mutex<([u64; BUCKETS.len() + 1], f64)>,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { counts: Mutex::new(([0; BUCKETS.len() + 1], 0.0)) }
    }
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = BUCKETS.iter().position(|&b| seconds <= b).unwrap_or(BUCKETS.len());
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.0[bucket] += 1;
        counts.1 += seconds;
    }

    pub fn write(&self, out: &mut String, name: &str, help: &str) {
        let (counts, sum) = *self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (bound, count) in BUCKETS.iter().zip(counts) {
            total += count;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {total}");
        }
        total += counts[BUCKETS.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}\n{name}_sum {sum}\n{name}_count {total}");
    }
}

/// HTTP requests answered, by endpoint and status code.
#[derive(Default)]
pub struct Answered(Mutex<Vec<(&'static str, u16, u64)>>);

impl Answered {
    /// One answered request.
    pub fn count(&self, endpoint: &'static str, status: u16) {
        let mut requests = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match requests.iter_mut().find(|(e, s, _)| *e == endpoint && *s == status) {
            Some((_, _, count)) => *count += 1,
            None => requests.push((endpoint, status, 1)),
        }
    }

    pub fn write(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP monogen_http_requests_total HTTP requests answered, by endpoint and status.");
        let _ = writeln!(out, "# TYPE monogen_http_requests_total counter");
        let requests = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (endpoint, status, count) in requests {
            let _ = writeln!(out, "monogen_http_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {count}");
        }
    }
}

/// A gauge's or a counter's Prometheus text.
pub fn write_metric(out: &mut String, kind: &str, name: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// The last lines of `/metrics`: which workload this server was generated for.
pub fn write_info(out: &mut String) {
    let _ = writeln!(out, "# HELP monogen_info The workload this server was generated for.\n# TYPE monogen_info gauge\nmonogen_info{{workload=\"{WORKLOAD}\"}} 1");
}
