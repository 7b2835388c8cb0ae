//! The HTTP server: OpenAI's completions API (and its chat completions, for a workload that sets
//! `serving.chat`) as its official clients use it, over the [`Engine`]'s continuous batching.
//!
//! - `POST /v1/completions` (`POST /v1/chat/completions`): `max_tokens`, `temperature`, `top_p`,
//!   `top_k`, `seed`, `stop`, `stream` (server-sent events ending with `data: [DONE]`, and a usage
//!   chunk with `stream_options.include_usage`), `usage` and `finish_reason`; the class of a
//!   request in `priority` or the `X-Priority` header (PRIORITIES, most urgent first).
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
//!
//! A request the server cannot serve gets a 4xx answer with an OpenAI error object that names
//! what is wrong; a full queue gets 429 with `Retry-After`. With an API key, every `/v1/` route
//! wants `Authorization: Bearer KEY`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

#[only_if(chat)]
use crate::chat_template;
use crate::detokenizer::DecodeStream;
use crate::engine::{self, Engine, Event, Refused, Request};
use crate::http::{self, ApiError, Listener, json_response};
pub use crate::http::{Options, ServeError};
use crate::metrics::Metrics;
use crate::{DEFAULT_PRIORITY, GenerateParams, MAX_BODY_BYTES, MAX_SEQ_LEN, Model, PRIORITIES, StopReason, Tokenizer, WORKLOAD};

/// A running server: its address, and the way to stop it.
pub struct Server {
    listener: Listener,
    state: Arc<AppState>,
}

impl Server {
    /// Loads the model and its tokenizer, listens on `options.host:options.port` and serves
    /// on threads of its own until [`Server::stop`].
    pub fn start(options: &Options) -> Result<Server, ServeError> {
        let model = Arc::new(Model::load(&options.model)?);
        let tokenizer = Tokenizer::load_with_encoder(&options.model)?;
        #[only_if(chat)]
        let chat = ChatTemplate::built_in().map_err(ServeError::ChatTemplate)?;
        let metrics = Arc::new(Metrics::default());
        let engine = Engine::start(model, metrics.clone());
        let state = Arc::new(AppState {
            engine,
            tokenizer,
            #[only_if(chat)]
            chat,
            api_key: options.api_key.clone().filter(|key| !key.is_empty()),
            metrics,
            created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            next_id: AtomicU64::new(1),
        });
        let listener = Listener::bind(&options.host, options.port, router(state.clone()))?;
        Ok(Server { listener, state })
    }

    /// The address it listens on (the port chosen, where 0 was asked for).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.listener.addr()
    }

    /// Blocks until the process gets SIGTERM or SIGINT (Ctrl-C).
    pub fn wait_for_signal(&self) {
        self.listener.wait_for_signal();
    }

    /// Stops taking connections and requests, lets every request taken run to its end, and
    /// returns when they have.
    pub fn stop(mut self) {
        self.state.engine.close();
        self.listener.stop();
        self.state.engine.stop();
    }
}

/// What every handler shares.
struct AppState {
    engine: Engine,
    tokenizer: Tokenizer,
    #[only_if(chat)]
    chat: ChatTemplate,
    api_key: Option<String>,
    metrics: Arc<Metrics>,
    created: u64,
    next_id: AtomicU64,
}

fn router(state: Arc<AppState>) -> Router {
    #[only_if(chat)]
    let chat = post(chat_completions);
    #[only_if(not(chat))]
    let chat = post(no_chat);
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", chat)
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(http::refuse_declared_oversize))
        .with_state(state)
}

/// Counts the answer in the metrics, then gives it.
fn answered(state: &AppState, endpoint: &'static str, result: Result<Response, ApiError>) -> Response {
    let response = result.unwrap_or_else(IntoResponse::into_response);
    state.metrics.request(endpoint, response.status().as_u16());
    response
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    http::health(state.engine.closed())
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    http::metrics_text(state.metrics.render())
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let result = authorize(&state, &headers).map(|()| http::models(state.created));
    answered(&state, "models", result)
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    http::authorize(state.api_key.as_deref(), headers)
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let body = http::read_body(body)?;
        let prompt = match body.get("prompt") {
            None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
            Some(Value::String(text)) => encode(&state, text)?,
            Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_u64) => items
                .iter()
                .map(|id| u32::try_from(id.as_u64().unwrap_or(u64::MAX)).map_err(|_| ApiError::invalid("prompt", "a token id is out of range")))
                .collect::<Result<Vec<u32>, ApiError>>()?,
            Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
                encode(&state, items[0].as_str().unwrap_or_default())?
            }
            Some(Value::Array(items)) if items.len() > 1 && items.iter().all(Value::is_string) => {
                return Err(ApiError::invalid("prompt", "one prompt per request: send the others as requests of their own"));
            }
            Some(_) => {
                return Err(ApiError::invalid("prompt", "`prompt` must be a string, or an array of token ids"));
            }
        };
        let request = parse_request(&state, &headers, &body, prompt, Endpoint::Completions)?;
        run(&state, request).await
    }
    .await;
    answered(&state, "completions", result)
}

#[only_if(chat)]
async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let body = http::read_body(body)?;
        let messages = match body.get("messages") {
            Some(Value::Array(messages)) if !messages.is_empty() => messages,
            Some(Value::Array(_)) => return Err(ApiError::invalid("messages", "`messages` is empty")),
            Some(_) => return Err(ApiError::invalid("messages", "`messages` must be an array of messages")),
            None => return Err(ApiError::invalid("messages", "`messages` is required")),
        };
        let messages = chat_messages(messages)?;
        let text = state.chat.render(&messages).map_err(|reason| ApiError::invalid("messages", reason))?;
        let prompt = encode_as_is(&state, &text)?;
        let request = parse_request(&state, &headers, &body, prompt, Endpoint::Chat)?;
        run(&state, request).await
    }
    .await;
    answered(&state, "chat_completions", result)
}

/// `/v1/chat/completions` of a server whose workload does not set `serving.chat`.
#[only_if(not(chat))]
async fn no_chat(State(state): State<Arc<AppState>>) -> Response {
    let refused = ApiError {
        status: StatusCode::NOT_FOUND,
        message: "this server has no chat completions: its workload serves a model without a chat template (serving.chat is not set); use /v1/completions".into(),
        param: None,
        code: None,
    };
    answered(&state, "chat_completions", Err(refused))
}

/// The tokens of a prompt, with the special tokens the tokenizer adds (BOS).
fn encode(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    state.tokenizer.encode(text).map_err(ApiError::server)
}

/// The tokens of a rendered chat template, which places its special tokens itself.
#[only_if(chat)]
fn encode_as_is(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    state.tokenizer.encode_as_is(text).map_err(ApiError::server)
}

#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Completions,
    #[only_if(chat)]
    Chat,
}

impl Endpoint {
    /// The request field that holds the prompt.
    fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Completions => "prompt",
            #[only_if(chat)]
            Endpoint::Chat => "messages",
        }
    }
}

/// A checked request, ready for the engine.
struct Parsed {
    endpoint: Endpoint,
    prompt: Vec<u32>,
    params: GenerateParams,
    priority: u8,
    stream: bool,
    include_usage: bool,
    stop: Vec<String>,
}

/// Fields the server reads, and fields it accepts at the value that means "off".
const FIELDS: &[&str] = &[
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
    "stop", "stream", "stream_options", "priority", "n", "user", "best_of", "echo", "logprobs", "top_logprobs",
    "presence_penalty", "frequency_penalty", "logit_bias", "suffix", "response_format", "tools", "tool_choice",
    "parallel_tool_calls",
];

fn parse_request(
    state: &AppState,
    headers: &HeaderMap,
    body: &Map<String, Value>,
    prompt: Vec<u32>,
    endpoint: Endpoint,
) -> Result<Parsed, ApiError> {
    http::check_fields_and_model(body, FIELDS)?;
    // Fields accepted only at the value that leaves them out.
    let field = |name| body.get(name).filter(|v| !v.is_null());
    let refuse = |name: &'static str| Err(ApiError::invalid(name, format!("`{name}` is not supported by this server")));
    let off = [
        ("n", field("n").is_none_or(|v| v.as_u64() == Some(1))),
        ("best_of", field("best_of").is_none_or(|v| v.as_u64() == Some(1))),
        ("echo", field("echo").is_none_or(|v| v.as_bool() == Some(false))),
        ("logprobs", field("logprobs").is_none_or(|v| v.as_bool() == Some(false))),
        ("top_logprobs", field("top_logprobs").is_none_or(|v| v.as_u64() == Some(0))),
        ("presence_penalty", field("presence_penalty").is_none_or(|v| v.as_f64() == Some(0.0))),
        ("frequency_penalty", field("frequency_penalty").is_none_or(|v| v.as_f64() == Some(0.0))),
        ("logit_bias", field("logit_bias").is_none_or(|v| v.as_object().is_some_and(Map::is_empty))),
        ("suffix", field("suffix").is_none_or(|v| v.as_str() == Some(""))),
        ("response_format", field("response_format").is_none_or(|v| v.get("type").and_then(Value::as_str) == Some("text"))),
        ("tools", field("tools").is_none_or(|v| v.as_array().is_some_and(Vec::is_empty))),
        ("tool_choice", field("tool_choice").is_none_or(|v| v.as_str() == Some("none"))),
    ];
    if let Some((name, _)) = off.iter().find(|(_, off)| !off) {
        return refuse(name);
    }

    let room = MAX_SEQ_LEN.saturating_sub(prompt.len());
    if room == 0 {
        return Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "the prompt is {} tokens long, and this model's context holds {MAX_SEQ_LEN} (prompt and new tokens together): shorten the prompt",
                prompt.len()
            ),
            param: Some(endpoint.prompt_field()),
            code: Some("context_length_exceeded"),
        });
    }
    let max_tokens = match (body.get("max_tokens"), body.get("max_completion_tokens")) {
        (Some(v), _) if !v.is_null() => Some(("max_tokens", v)),
        (_, Some(v)) if !v.is_null() => Some(("max_completion_tokens", v)),
        _ => None,
    };
    let max_tokens = match max_tokens {
        None if endpoint == Endpoint::Completions => 16.min(room),
        None => room,
        Some((name, v)) => {
            let n = v.as_u64().ok_or_else(|| ApiError::invalid("max_tokens", format!("`{name}` must be a positive integer")))?;
            if n == 0 || n > room as u64 {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!(
                        "`{name}` is {n}, and must be between 1 and {room}: the prompt takes {} of the context's {MAX_SEQ_LEN} tokens",
                        prompt.len()
                    ),
                ));
            }
            n as usize
        }
    };
    let number = |name: &'static str, default: f64| match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| ApiError::invalid(name, format!("`{name}` must be a number"))),
    };
    let temperature = number("temperature", 1.0)?;
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid("temperature", format!("`temperature` is {temperature}, and must be between 0 and 2")));
    }
    let top_p = number("top_p", 1.0)?;
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", format!("`top_p` is {top_p}, and must be above 0 and at most 1")));
    }
    let top_k = match body.get("top_k") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_i64() {
            Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            _ => return Err(ApiError::invalid("top_k", "`top_k` must be a positive integer, or 0 or -1 for all tokens")),
        },
    };
    let seed = match body.get("seed") {
        None | Some(Value::Null) => state.next_id.fetch_add(1, Ordering::Relaxed) ^ state.created.rotate_left(17),
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(s), _) => s,
            (None, Some(s)) => s as u64,
            _ => return Err(ApiError::invalid("seed", "`seed` must be an integer")),
        },
    };
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if items.len() <= 4 && items.iter().all(Value::is_string) => {
            items.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()
        }
        Some(_) => return Err(ApiError::invalid("stop", "`stop` must be a string or an array of at most 4 strings")),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a `stop` string is empty"));
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("stream", "`stream` must be true or false")),
    };
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(options)) => match options.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::invalid("stream_options", "`stream_options.include_usage` must be true or false")),
        },
        Some(_) => return Err(ApiError::invalid("stream_options", "`stream_options` must be an object")),
    };
    let priority = priority(body, headers)?;
    let params = GenerateParams { max_tokens, temperature: temperature as f32, top_k, top_p: top_p as f32, seed };
    engine::check(&prompt, &params).map_err(|e| ApiError::bad(e.to_string()))?;
    Ok(Parsed { endpoint, prompt, params, priority, stream, include_usage, stop })
}

/// The request's class: its `priority` field, else its `X-Priority` header, else the default.
fn priority(body: &Map<String, Value>, headers: &HeaderMap) -> Result<u8, ApiError> {
    let named = match body.get("priority") {
        Some(Value::String(name)) => Some(name.clone()),
        Some(Value::Null) | None => match headers.get("x-priority") {
            Some(v) => Some(v.to_str().map_err(|_| ApiError::invalid("priority", "the X-Priority header is not text"))?.trim().to_string()),
            None => None,
        },
        Some(_) => return Err(ApiError::invalid("priority", "`priority` must be the name of a class")),
    };
    match named {
        None => Ok(DEFAULT_PRIORITY),
        Some(name) => PRIORITIES.iter().position(|p| *p == name).map(|i| i as u8).ok_or_else(|| {
            ApiError::invalid("priority", format!("unknown priority class `{name}`: this server has {}", PRIORITIES.join(", ")))
        }),
    }
}

/// Hands the request to the engine and answers: one JSON object, or a stream of events.
async fn run(state: &Arc<AppState>, request: Parsed) -> Result<Response, ApiError> {
    let (events, receiver) = mpsc::unbounded_channel();
    let submitted = state.engine.submit(Request {
        prompt: request.prompt.clone(),
        params: request.params.clone(),
        priority: request.priority,
        events,
    });
    match submitted {
        Ok(()) => {}
        Err(Refused::QueueFull) => return Err(ApiError::queue_full()),
        Err(Refused::Stopped) => return Err(ApiError::stopping()),
    }
    state.metrics.prompt_tokens.fetch_add(request.prompt.len() as u64, Ordering::Relaxed);
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let reply = Reply { id, created, endpoint: request.endpoint, prompt_tokens: request.prompt.len() };
    let text = Text::new(request.stop);
    if request.stream {
        Ok(stream_response(state.clone(), reply, receiver, text, request.include_usage))
    } else {
        whole_response(state, reply, receiver, text).await
    }
}

/// What every chunk or answer of one request repeats.
#[derive(Clone, Copy)]
struct Reply {
    id: u64,
    created: u64,
    endpoint: Endpoint,
    prompt_tokens: usize,
}

impl Reply {
    fn id(&self) -> String {
        match self.endpoint {
            Endpoint::Completions => format!("cmpl-{:016x}", self.id),
            #[only_if(chat)]
            Endpoint::Chat => format!("chatcmpl-{:016x}", self.id),
        }
    }

    fn usage(&self, completion_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }

    fn object(&self, stream: bool) -> &'static str {
        match (self.endpoint, stream) {
            (Endpoint::Completions, _) => "text_completion",
            #[only_if(chat)]
            (Endpoint::Chat, false) => "chat.completion",
            #[only_if(chat)]
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    /// One choice of an answer or a chunk.
    fn choice(&self, text: &str, finish: Option<&str>, part: Part) -> Value {
        match (self.endpoint, part) {
            (Endpoint::Completions, _) => json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }),
            #[only_if(chat)]
            (Endpoint::Chat, Part::Whole) => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": null,
                "finish_reason": finish,
            }),
            #[only_if(chat)]
            (Endpoint::Chat, chunk) => {
                let delta = match (chunk == Part::First, finish.is_some() && text.is_empty()) {
                    (true, _) => json!({ "role": "assistant", "content": text }),
                    (false, true) => json!({}),
                    (false, false) => json!({ "content": text }),
                };
                json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish })
            }
        }
    }

    fn chunk(&self, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut chunk = json!({
            "id": self.id(),
            "object": self.object(true),
            "created": self.created,
            "model": WORKLOAD,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        chunk
    }
}

/// What a choice is part of: a whole answer, or a streamed answer's first chunk or a later one.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Whole,
    First,
    Next,
}

/// The finish reason OpenAI's clients know for a stop.
fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::Eos | StopReason::Cancelled => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

async fn whole_response(
    state: &AppState,
    reply: Reply,
    mut receiver: mpsc::UnboundedReceiver<Event>,
    mut text: Text,
) -> Result<Response, ApiError> {
    let mut out = String::new();
    let mut tokens = 0;
    let finish = loop {
        match receiver.recv().await {
            Some(Event::Token(id)) => {
                tokens += 1;
                let (piece, stopped) = text.push(&state.tokenizer, id).map_err(ApiError::server)?;
                out.push_str(&piece);
                if stopped {
                    break "stop";
                }
            }
            Some(Event::Done(stop)) => {
                out.push_str(&text.finish());
                break finish_reason(stop);
            }
            Some(Event::Failed(reason)) => return Err(ApiError::server(reason)),
            None => return Err(ApiError::server("the engine stopped")),
        }
    };
    drop(receiver);
    Ok(json_response(&json!({
        "id": reply.id(),
        "object": reply.object(false),
        "created": reply.created,
        "model": WORKLOAD,
        "choices": [reply.choice(&out, Some(finish), Part::Whole)],
        "usage": reply.usage(tokens),
    })))
}

/// The events of a streamed answer, as the engine's tokens arrive. Dropping it (the client went
/// away) drops the receiver, which frees the request's place in the engine.
fn stream_response(
    state: Arc<AppState>,
    reply: Reply,
    receiver: mpsc::UnboundedReceiver<Event>,
    text: Text,
    include_usage: bool,
) -> Response {
    struct Streaming {
        state: Arc<AppState>,
        reply: Reply,
        receiver: Option<mpsc::UnboundedReceiver<Event>>,
        text: Text,
        include_usage: bool,
        tokens: usize,
        /// What the next chunk is.
        part: Part,
        /// The data of events ready to go.
        ready: VecDeque<String>,
    }

    impl Streaming {
        fn piece(&mut self, piece: &str) {
            if !piece.is_empty() {
                let choice = self.reply.choice(piece, None, self.part);
                self.part = Part::Next;
                self.ready.push_back(self.reply.chunk(vec![choice], None).to_string());
            }
        }

        /// The last chunk (its finish reason), the usage where asked for, and `[DONE]`; the
        /// receiver goes, which ends the request in the engine if it still runs.
        fn end(&mut self, finish: &str) {
            let choice = self.reply.choice("", Some(finish), self.part);
            self.ready.push_back(self.reply.chunk(vec![choice], None).to_string());
            if self.include_usage {
                let usage = self.reply.usage(self.tokens);
                self.ready.push_back(self.reply.chunk(Vec::new(), Some(usage)).to_string());
            }
            self.ready.push_back("[DONE]".into());
            self.receiver = None;
        }

        fn fail(&mut self, reason: impl ToString) {
            let error = ApiError::server(reason);
            let body = json!({ "error": { "message": error.message, "type": error.kind(), "param": null, "code": null } });
            self.ready.push_back(body.to_string());
            self.ready.push_back("[DONE]".into());
            self.receiver = None;
        }
    }

    let streaming = Streaming {
        state,
        reply,
        receiver: Some(receiver),
        text,
        include_usage,
        tokens: 0,
        part: Part::First,
        ready: VecDeque::new(),
    };
    let events = stream::unfold(streaming, |mut s| async move {
        loop {
            if let Some(data) = s.ready.pop_front() {
                return Some((Ok::<SseEvent, Infallible>(SseEvent::default().data(data)), s));
            }
            let event = s.receiver.as_mut()?.recv().await;
            match event {
                Some(Event::Token(id)) => {
                    s.tokens += 1;
                    match s.text.push(&s.state.tokenizer, id) {
                        Ok((piece, stopped)) => {
                            s.piece(&piece);
                            if stopped {
                                s.end("stop");
                            }
                        }
                        Err(e) => s.fail(e),
                    }
                }
                Some(Event::Done(stop)) => {
                    let rest = s.text.finish();
                    s.piece(&rest);
                    s.end(finish_reason(stop));
                }
                Some(Event::Failed(reason)) => s.fail(reason),
                None => s.fail("the engine stopped"),
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)).into_response()
}

/// The text of a request's tokens, held back where it might be the start of a stop string.
struct Text {
    decoder: DecodeStream,
    stop: Vec<String>,
    /// Text decoded and not yet given out.
    pending: String,
    stopped: bool,
}

impl Text {
    fn new(stop: Vec<String>) -> Text {
        Text { decoder: DecodeStream::default(), stop, pending: String::new(), stopped: false }
    }

    /// Adds token `id`, decoded by `tokenizer`; returns the text that can be given out now,
    /// and whether a stop string was met (the text before it is all that remains).
    fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<(String, bool), String> {
        if self.stopped {
            return Ok((String::new(), true));
        }
        if let Some(piece) = self.decoder.step(id, |ids| tokenizer.decode(ids).map_err(|e| e.to_string()))? {
            self.pending.push_str(&piece);
        }
        let found = self.stop.iter().filter_map(|s| self.pending.find(s.as_str())).min();
        if let Some(at) = found {
            self.stopped = true;
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return Ok((out, true));
        }
        // Keep the longest end of the pending text that begins a stop string.
        let keep = self
            .stop
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|prefix| self.pending.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        Ok((out, false))
    }

    /// The text held back, at the end of generation.
    fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// The model's chat template, rendered with minijinja as Hugging Face renders it with Jinja2
/// (`trim_blocks`, `lstrip_blocks`, Python's string methods, `raise_exception`,
/// `strftime_now`).
#[only_if(chat)]
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

#[only_if(chat)]
impl ChatTemplate {
    /// The chat template of the workload (`serving.chat`), which the crate embeds.
    pub fn built_in() -> Result<ChatTemplate, String> {
        ChatTemplate::new(chat_template::SOURCE.to_string(), chat_template::BOS_TOKEN.to_string(), chat_template::EOS_TOKEN.to_string())
    }

    /// A chat template of Jinja `source`, whose `bos_token` and `eos_token` are these.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<ChatTemplate, String> {
        let mut env = minijinja::Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| e.to_string())?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source).map_err(|e| format!("{e:#}"))?;
        Ok(ChatTemplate { env, bos_token, eos_token })
    }

    /// The prompt of `messages` (an array of `{"role", "content"}` objects), ending where the
    /// assistant's answer starts.
    pub fn render(&self, messages: &Value) -> Result<String, String> {
        self.render_with(messages, true, &Map::new())
    }

    /// The text of `messages`, with the assistant's header after them if
    /// `add_generation_prompt`, and the template's further variables `extra`.
    pub fn render_with(&self, messages: &Value, add_generation_prompt: bool, extra: &Map<String, Value>) -> Result<String, String> {
        let template = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut context = extra.clone();
        context.insert("messages".into(), messages.clone());
        context.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));
        context.insert("bos_token".into(), Value::String(self.bos_token.clone()));
        context.insert("eos_token".into(), Value::String(self.eos_token.clone()));
        template
            .render(minijinja::Value::from(minijinja::value::Serde(context)))
            .map_err(|e| format!("the chat template refused the messages: {e}"))
    }
}

/// Checks chat messages: each an object with a `role` and text `content` (a string, or an
/// array of text parts, which are joined).
#[only_if(chat)]
fn chat_messages(messages: &[Value]) -> Result<Value, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let Some(object) = message.as_object() else {
            return Err(ApiError::invalid("messages", format!("messages[{i}] must be an object")));
        };
        let role = match object.get("role") {
            Some(Value::String(role)) if ["system", "developer", "user", "assistant", "tool"].contains(&role.as_str()) => role,
            Some(Value::String(role)) => {
                return Err(ApiError::invalid("messages", format!("messages[{i}].role `{role}` is not system, user, assistant or tool")));
            }
            _ => return Err(ApiError::invalid("messages", format!("messages[{i}].role must be a string"))),
        };
        let content = match object.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Null) | None => String::new(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                "messages",
                                format!("messages[{i}].content: only text parts (`{{\"type\": \"text\", \"text\": ...}}`) are supported"),
                            ));
                        }
                    }
                }
                text
            }
            Some(_) => return Err(ApiError::invalid("messages", format!("messages[{i}].content must be a string"))),
        };
        let role = if role == "developer" { "system" } else { role.as_str() };
        out.push(json!({ "role": role, "content": content }));
    }
    Ok(Value::Array(out))
}

/// `strftime_now(format)`, which some chat templates call for today's date: %d, %m, %Y, %b, %B,
/// %H, %M and %S, in UTC.
#[only_if(chat)]
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] =
        ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    let name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// How long a streamed answer may go without an event before a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
