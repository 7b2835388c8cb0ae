//! The embeddings server: OpenAI's embeddings API as its official clients use it, over batches
//! of sentences.
//!
//! - `POST /v1/embeddings`: `input` (a string, an array of strings, an array of token ids, or an
//!   array of such arrays), `encoding_format` (`float`, or `base64`: the little-endian f32
//!   bytes, which the official Python client asks for), `dimensions` (only this model's),
//!   `user`; the answer has one vector per input, in order, and `usage`.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
//!
//! One thread runs the encoder. The first sentence waiting starts a batch; the batch waits up
//! to BATCH_WAIT for sentences of other requests to join it, until MAX_BATCH sentences, and
//! runs them through the layers at once. A sentence's vector is the one the crate's
//! `Encoder::embed` gives it alone, up to the rounding of a product over more rows. A request
//! the server cannot serve gets a 4xx answer with an OpenAI error object that names what is
//! wrong; a full queue gets 429 with `Retry-After`.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use crate::http::{self, ApiError, Answered, Histogram, Listener, json_response, write_metric};
pub use crate::http::{Options, ServeError};
use crate::{BATCH_WAIT, HIDDEN_SIZE, MAX_BATCH, MAX_BODY_BYTES, MAX_QUEUE, MAX_SEQ_LEN, Model, Tokenizer, VOCAB_SIZE, WORKLOAD};

/// Most inputs one request may send (OpenAI's bound).
pub const MAX_INPUTS: usize = 2048;

/// A running server: its address, and the way to stop it.
pub struct Server {
    listener: Listener,
    state: Arc<AppState>,
    encoder: Option<JoinHandle<()>>,
}

impl Server {
    /// Loads the model and its tokenizer, listens on `options.host:options.port` and serves
    /// on threads of its own until [`Server::stop`].
    pub fn start(options: &Options) -> Result<Server, ServeError> {
        let model = Model::load(&options.model)?;
        let tokenizer = Tokenizer::load(&options.model)?;
        let state = Arc::new(AppState {
            tokenizer,
            api_key: options.api_key.clone().filter(|key| !key.is_empty()),
            queue: Queue::default(),
            metrics: Metrics::default(),
            created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        });
        let encoder = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("encoder".into())
                .spawn(move || encode_batches(&model, &state))
                .map_err(ServeError::Runtime)?
        };
        let listener = match Listener::bind(&options.host, options.port, router(state.clone())) {
            Ok(listener) => listener,
            Err(e) => {
                state.queue.close();
                let _ = encoder.join();
                return Err(e);
            }
        };
        Ok(Server { listener, state, encoder: Some(encoder) })
    }

    /// The address it listens on (the port chosen, where 0 was asked for).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.listener.addr()
    }

    /// Blocks until the process gets SIGTERM or SIGINT (Ctrl-C).
    pub fn wait_for_signal(&self) {
        self.listener.wait_for_signal();
    }

    /// Stops taking connections and requests, embeds every request taken, and returns when
    /// they are answered.
    pub fn stop(mut self) {
        self.state.queue.close();
        self.listener.stop();
        if let Some(encoder) = self.encoder.take() {
            let _ = encoder.join();
        }
    }
}

/// What every handler shares.
struct AppState {
    tokenizer: Tokenizer,
    api_key: Option<String>,
    queue: Queue,
    metrics: Metrics,
    created: u64,
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(http::refuse_declared_oversize))
        .with_state(state)
}

/// One request's sentences, waiting for the encoder.
struct Job {
    sentences: Vec<Vec<u32>>,
    arrived: Instant,
    reply: oneshot::Sender<Vec<Vec<f32>>>,
}

/// The requests waiting for the encoder, in order of arrival.
#[derive(Default)]
struct Queue {
    state: Mutex<(VecDeque<Job>, bool)>,
    ready: Condvar,
}

impl Queue {
    /// Adds `job`, unless MAX_QUEUE requests wait already or the server is stopping.
    fn push(&self, job: Job) -> Result<(), ApiError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (jobs, closed) = &mut *state;
        if *closed {
            return Err(ApiError::stopping());
        }
        if jobs.len() >= MAX_QUEUE {
            return Err(ApiError::queue_full());
        }
        jobs.push_back(job);
        self.ready.notify_one();
        Ok(())
    }

    /// Takes no more requests; those waiting are still embedded.
    fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.ready.notify_all();
    }

    fn closed(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    fn len(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    /// The next batch: the requests at the front whose sentences fit MAX_BATCH together (the
    /// first one whatever its size), once MAX_BATCH sentences wait or the first has waited
    /// BATCH_WAIT. `None` once the queue is closed and empty.
    fn next_batch(&self) -> Option<Vec<Job>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let (jobs, closed) = &*state;
            let Some(first) = jobs.front() else {
                if *closed {
                    return None;
                }
                state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            let waiting: usize = jobs.iter().map(|job| job.sentences.len()).sum();
            let deadline = first.arrived + BATCH_WAIT;
            let now = Instant::now();
            if waiting >= MAX_BATCH || now >= deadline || *closed {
                break;
            }
            state = self.ready.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        let jobs = &mut state.0;
        let mut batch = vec![jobs.pop_front().expect("a request waits")];
        let mut sentences = batch[0].sentences.len();
        while let Some(next) = jobs.front()
            && sentences + next.sentences.len() <= MAX_BATCH
        {
            sentences += next.sentences.len();
            batch.extend(jobs.pop_front());
        }
        Some(batch)
    }
}

/// The encoder's thread: embeds batch after batch until the queue is closed and empty.
fn encode_batches(model: &Model, state: &AppState) {
    let mut encoder = model.encoder();
    while let Some(jobs) = state.queue.next_batch() {
        // A request whose client went away is not embedded.
        let jobs: Vec<Job> = jobs.into_iter().filter(|job| !job.reply.is_closed()).collect();
        let sentences: Vec<&[u32]> = jobs.iter().flat_map(|job| job.sentences.iter().map(Vec::as_slice)).collect();
        if sentences.is_empty() {
            continue;
        }
        let started = Instant::now();
        state.metrics.running.store(sentences.len(), Ordering::Relaxed);
        // The handlers checked every sentence, so the encoder refuses none.
        let embedded = encoder.embed(&sentences);
        state.metrics.running.store(0, Ordering::Relaxed);
        let Ok(mut vectors) = embedded else { continue };
        __normalize!(vectors);
        state.metrics.batch(&sentences, started.elapsed());
        let mut vectors = vectors.drain(..);
        for job in jobs {
            let mine: Vec<Vec<f32>> = vectors.by_ref().take(job.sentences.len()).collect();
            let _ = job.reply.send(mine);
        }
    }
}

/// What the server counts, and `GET /metrics`'s text of it.
#[derive(Default)]
struct Metrics {
    answered: Answered,
    sentences: AtomicU64,
    tokens: AtomicU64,
    batches: AtomicU64,
    batch_nanos: AtomicU64,
    /// Sentences in the batch running now.
    running: AtomicUsize,
    request_latency: Histogram,
}

impl Metrics {
    fn batch(&self, sentences: &[&[u32]], elapsed: std::time::Duration) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.sentences.fetch_add(sentences.len() as u64, Ordering::Relaxed);
        self.tokens.fetch_add(sentences.iter().map(|s| s.len() as u64).sum(), Ordering::Relaxed);
        self.batch_nanos.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    fn render(&self, queue_depth: usize) -> String {
        let mut out = String::new();
        let count = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        write_metric(&mut out, "gauge", "monogen_queue_depth", "Requests waiting for the encoder.", queue_depth as f64);
        write_metric(&mut out, "gauge", "monogen_running_sentences", "Sentences in the batch being embedded.", self.running.load(Ordering::Relaxed) as f64);
        write_metric(&mut out, "counter", "monogen_embedded_sentences_total", "Sentences embedded.", count(&self.sentences));
        write_metric(&mut out, "counter", "monogen_prompt_tokens_total", "Tokens of the sentences embedded.", count(&self.tokens));
        write_metric(&mut out, "counter", "monogen_batches_total", "Batches run through the encoder.", count(&self.batches));
        write_metric(&mut out, "counter", "monogen_batch_seconds_total", "Time spent embedding batches.", count(&self.batch_nanos) / 1e9);
        self.answered.write(&mut out);
        self.request_latency.write(&mut out, "monogen_request_seconds", "From an embeddings request's arrival to its answer.");
        http::write_info(&mut out);
        out
    }
}

/// Counts the answer in the metrics, then gives it.
fn answered(state: &AppState, endpoint: &'static str, result: Result<Response, ApiError>) -> Response {
    let response = result.unwrap_or_else(IntoResponse::into_response);
    state.metrics.answered.count(endpoint, response.status().as_u16());
    response
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    http::health(state.queue.closed())
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    http::metrics_text(state.metrics.render(state.queue.len()))
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let result = http::authorize(state.api_key.as_deref(), &headers).map(|()| http::models(state.created));
    answered(&state, "models", result)
}

/// Fields the server reads.
const FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

async fn embeddings(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrived = Instant::now();
    let result = async {
        http::authorize(state.api_key.as_deref(), &headers)?;
        let body = http::read_body(body)?;
        http::check_fields_and_model(&body, FIELDS)?;
        let base64 = match body.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(f)) if f == "float" => false,
            Some(Value::String(f)) if f == "base64" => true,
            Some(_) => return Err(ApiError::invalid("encoding_format", "`encoding_format` must be \"float\" or \"base64\"")),
        };
        match body.get("dimensions") {
            None | Some(Value::Null) => {}
            Some(v) if v.as_u64() == Some(HIDDEN_SIZE as u64) => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    "dimensions",
                    format!("`dimensions` must be {HIDDEN_SIZE}: this model's vectors are not shortened"),
                ));
            }
        }
        let sentences = inputs(&state.tokenizer, &body)?;
        let tokens: usize = sentences.iter().map(Vec::len).sum();
        let count = sentences.len();
        let (reply, answer) = oneshot::channel();
        state.queue.push(Job { sentences, arrived, reply })?;
        let vectors = answer.await.map_err(|_| ApiError::server("the encoder stopped"))?;
        if vectors.len() != count {
            return Err(ApiError::server("the encoder answered with fewer vectors than inputs"));
        }
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(index, vector)| {
                let embedding = if base64 { Value::String(base64_f32(vector)) } else { json!(vector) };
                json!({ "object": "embedding", "index": index, "embedding": embedding })
            })
            .collect();
        Ok(json_response(&json!({
            "object": "list",
            "data": data,
            "model": WORKLOAD,
            "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
        })))
    }
    .await;
    state.metrics.request_latency.observe(arrived.elapsed());
    answered(&state, "embeddings", result)
}

/// The token ids of each input: a string, an array of strings, an array of token ids (one
/// sentence, as the tokenizer gives it: [CLS] and [SEP] included), or an array of such arrays.
fn inputs(tokenizer: &Tokenizer, body: &Map<String, Value>) -> Result<Vec<Vec<u32>>, ApiError> {
    let shape = "`input` must be a string, an array of strings, an array of token ids, or an array of arrays of token ids";
    let input = body.get("input").ok_or_else(|| ApiError::invalid("input", "`input` is required"))?;
    let sentences: Vec<Vec<u32>> = match input {
        Value::String(text) => vec![encode(tokenizer, text, None)?],
        Value::Array(items) if items.is_empty() => return Err(ApiError::invalid("input", "`input` is empty")),
        Value::Array(items) if items.len() > MAX_INPUTS => {
            return Err(ApiError::invalid("input", format!("`input` has {} items, and at most {MAX_INPUTS} are taken", items.len())));
        }
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .enumerate()
            .map(|(i, text)| encode(tokenizer, text.as_str().unwrap_or_default(), Some(i)))
            .collect::<Result<_, _>>()?,
        Value::Array(items) if items.iter().all(Value::is_number) => vec![ids(items, None)?],
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .enumerate()
            .map(|(i, item)| ids(item.as_array().map_or(&[][..], Vec::as_slice), Some(i)))
            .collect::<Result<_, _>>()?,
        _ => return Err(ApiError::invalid("input", shape)),
    };
    Ok(sentences)
}

/// `input`, or `input[i]`, in messages.
fn which(index: Option<usize>) -> String {
    index.map_or_else(|| "`input`".to_string(), |i| format!("`input[{i}]`"))
}

fn too_long(index: Option<usize>, detail: String) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        message: format!("{} is {detail}, and this model reads at most {MAX_SEQ_LEN} tokens: shorten it", which(index)),
        param: Some("input"),
        code: Some("context_length_exceeded"),
    }
}

fn encode(tokenizer: &Tokenizer, text: &str, index: Option<usize>) -> Result<Vec<u32>, ApiError> {
    if text.is_empty() {
        return Err(ApiError::invalid("input", format!("{} is an empty string", which(index))));
    }
    match tokenizer.encode_whole(text).map_err(ApiError::server)? {
        Some(ids) => Ok(ids),
        None => Err(too_long(index, format!("longer than {} tokens", tokenizer.max_len()))),
    }
}

fn ids(items: &[Value], index: Option<usize>) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::invalid("input", format!("{} has no tokens", which(index))));
    }
    if items.len() > MAX_SEQ_LEN {
        return Err(too_long(index, format!("{} tokens long", items.len())));
    }
    items
        .iter()
        .map(|id| match id.as_u64() {
            Some(id) if id < VOCAB_SIZE as u64 => Ok(id as u32),
            _ => Err(ApiError::invalid(
                "input",
                format!("{} holds {id}, which is not a token id of this model's vocabulary (0 to {})", which(index), VOCAB_SIZE - 1),
            )),
        })
        .collect()
}

/// A vector as base64 of its little-endian f32 bytes (what `encoding_format: "base64"` asks for).
fn base64_f32(vector: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = ((chunk[0] as u32) << 16) | ((*chunk.get(1).unwrap_or(&0) as u32) << 8) | (*chunk.get(2).unwrap_or(&0) as u32);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
