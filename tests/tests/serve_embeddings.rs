//! The generated embeddings server (`all-minilm-l6-v2-serve-cpu-f32`: batches of up to 32
//! sentences, a 2 ms wait to fill them), on the real all-MiniLM-L6-v2:
//!
//! - sentences of requests sent together are embedded in shared batches, and each one's vector
//!   is the one the crate's library gives it alone (within `TOLERANCE`: a product over more rows
//!   may round differently);
//! - `encoding_format: "base64"` carries the same floats, token-id input the same sentences;
//! - every bad request gets a 4xx OpenAI error object naming what is wrong; a full queue answers
//!   429 with `Retry-After`, and the requests of clients that left are not embedded;
//! - stopping (through the library, and SIGTERM or SIGINT to the binary) lets the requests
//!   taken finish;
//! - OpenAI's official Python client talks to it.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use all_minilm_l6_v2_serve_cpu_f32 as served;
use monogen_tests::http::{Answer, ServeProcess, metric, post, send};
use monogen_tests::{model_dir, workspace_root};
use serde_json::{Value, json};
use served::serve::{Options, Server};
use served::{HIDDEN_SIZE, MAX_BATCH, MAX_QUEUE, MAX_SEQ_LEN, Model, Tokenizer, WORKLOAD};

/// Largest difference allowed between a served vector's values and the same sentence's alone.
const TOLERANCE: f32 = 1e-5;

const SENTENCES: [&str; 6] = [
    "A cat sat on the mat.",
    "Stocks fell sharply on Monday after the report.",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map sentences to vectors.",
    "It rained all day in the small coastal town, and nobody went out.",
    "Hello!",
];

/// A server on a loopback port, stopped when dropped.
struct Running(Option<Server>);

impl Running {
    fn start(dir: PathBuf, api_key: Option<&str>) -> Running {
        let options =
            Options { model: dir, host: "127.0.0.1".into(), port: 0, api_key: api_key.map(str::to_string) };
        Running(Some(Server::start(&options).unwrap()))
    }

    fn addr(&self) -> SocketAddr {
        self.0.as_ref().unwrap().addr()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(server) = self.0.take() {
            server.stop();
        }
    }
}

/// Each sentence's vector computed alone by the crate's library, normalized as the server
/// serves it.
fn alone(dir: &std::path::Path, sentences: &[&str]) -> Vec<Vec<f32>> {
    let model = Model::load(dir).unwrap();
    let tokenizer = Tokenizer::load(dir).unwrap();
    let mut encoder = model.encoder();
    sentences
        .iter()
        .map(|s| {
            let mut vectors = encoder.embed(&[tokenizer.encode(s).unwrap()]).unwrap();
            served::normalize(&mut vectors);
            vectors.remove(0)
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
    assert!(worst <= TOLERANCE, "{what}: differs by {worst} from the sentence embedded alone");
}

fn vectors(answer: &Answer) -> Vec<Vec<f32>> {
    assert_eq!(answer.status, 200, "{}", answer.body);
    let body = answer.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], WORKLOAD);
    body["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            d["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()
        })
        .collect()
}

/// The little-endian f32 values of base64 `text`.
fn from_base64(text: &str) -> Vec<f32> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut bytes = Vec::new();
    for quad in text.as_bytes().chunks(4) {
        let digits: Vec<u8> = quad.iter().filter(|&&c| c != b'=').map(|&c| value(c)).collect();
        let n = digits.iter().enumerate().fold(0u32, |n, (i, &d)| n | (d as u32) << (18 - 6 * i));
        bytes.extend(n.to_be_bytes()[1..digits.len()].iter());
    }
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn concurrent_requests_share_batches_and_each_vector_is_the_sentence_alone() {
    let Some(dir) = model_dir("all-minilm-l6-v2") else { return };
    let want = alone(&dir, &SENTENCES);
    let server = Running::start(dir, None);
    let addr = server.addr();
    // 24 requests at once, of one to three sentences each.
    let requests: Vec<Vec<usize>> =
        (0..24).map(|i| (0..1 + i % 3).map(|j| (i + j) % SENTENCES.len()).collect()).collect();
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = requests
            .iter()
            .map(|which| {
                let input: Vec<&str> = which.iter().map(|&k| SENTENCES[k]).collect();
                s.spawn(move || post(addr, "/v1/embeddings", &json!({ "model": WORKLOAD, "input": input })))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sentences = 0;
    for (which, answer) in requests.iter().zip(&answers) {
        let got = vectors(answer);
        assert_eq!(got.len(), which.len());
        for (vector, &k) in got.iter().zip(which) {
            assert_eq!(vector.len(), HIDDEN_SIZE);
            assert_close(vector, &want[k], SENTENCES[k]);
        }
        let usage = &answer.json()["usage"];
        assert_eq!(usage["prompt_tokens"], usage["total_tokens"]);
        assert!(usage["prompt_tokens"].as_u64().unwrap() >= 3 * which.len() as u64);
        sentences += which.len();
    }
    assert_eq!(metric(addr, "monogen_embedded_sentences_total"), sentences as f64);
    let batches = metric(addr, "monogen_batches_total");
    assert!(
        batches < answers.len() as f64,
        "{batches} batches for {} requests sent together: no two shared a batch",
        answers.len()
    );

    // base64 carries the same floats; token ids are the same sentences.
    let floats = vectors(&post(addr, "/v1/embeddings", &json!({ "model": WORKLOAD, "input": SENTENCES[1] })));
    let answer = post(
        addr,
        "/v1/embeddings",
        &json!({ "model": WORKLOAD, "input": SENTENCES[1], "encoding_format": "base64" }),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let decoded = from_base64(answer.json()["data"][0]["embedding"].as_str().unwrap());
    assert_eq!(decoded, floats[0], "base64 and float answers differ");
    let tokenizer = Tokenizer::load(model_dir("all-minilm-l6-v2").unwrap()).unwrap();
    let ids: Vec<Vec<u32>> = SENTENCES[..2].iter().map(|s| tokenizer.encode(s).unwrap()).collect();
    let by_ids = vectors(&post(addr, "/v1/embeddings", &json!({ "model": WORKLOAD, "input": ids })));
    assert_close(&by_ids[1], &want[1], "token ids");
    let one = vectors(&post(
        addr,
        "/v1/embeddings",
        &json!({ "model": WORKLOAD, "input": ids[0], "dimensions": HIDDEN_SIZE }),
    ));
    assert_close(&one[0], &want[0], "one sentence of token ids");
}

#[test]
fn every_bad_embeddings_request_gets_an_openai_error_object() {
    let Some(dir) = model_dir("all-minilm-l6-v2") else { return };
    let server = Running::start(dir, None);
    let addr = server.addr();
    let long = "word ".repeat(MAX_SEQ_LEN + 10);
    // (what, body, status, the error's param, what its message says)
    type Case<'a> = (&'a str, Vec<u8>, u16, Option<&'a str>, &'a str);
    let cases: Vec<Case> = vec![
        ("malformed JSON", b"{\"model\": ".to_vec(), 400, None, "not valid JSON"),
        ("not an object", b"[1, 2]".to_vec(), 400, None, "must be a JSON object"),
        (
            "no model",
            json!({ "input": "x" }).to_string().into_bytes(),
            400,
            Some("model"),
            "`model` is required",
        ),
        (
            "unknown model",
            json!({ "model": "gpt-9", "input": "x" }).to_string().into_bytes(),
            404,
            Some("model"),
            "does not exist",
        ),
        (
            "unknown field",
            json!({ "model": WORKLOAD, "input": "x", "temperature": 0 }).to_string().into_bytes(),
            400,
            None,
            "`temperature`",
        ),
        (
            "no input",
            json!({ "model": WORKLOAD }).to_string().into_bytes(),
            400,
            Some("input"),
            "`input` is required",
        ),
        (
            "input of the wrong type",
            json!({ "model": WORKLOAD, "input": 7 }).to_string().into_bytes(),
            400,
            Some("input"),
            "must be a string",
        ),
        (
            "mixed input",
            json!({ "model": WORKLOAD, "input": ["a", 7] }).to_string().into_bytes(),
            400,
            Some("input"),
            "must be a string",
        ),
        (
            "empty input",
            json!({ "model": WORKLOAD, "input": [] }).to_string().into_bytes(),
            400,
            Some("input"),
            "`input` is empty",
        ),
        (
            "empty string",
            json!({ "model": WORKLOAD, "input": ["a", ""] }).to_string().into_bytes(),
            400,
            Some("input"),
            "`input[1]` is an empty string",
        ),
        (
            "too long a text",
            json!({ "model": WORKLOAD, "input": long }).to_string().into_bytes(),
            400,
            Some("input"),
            "at most",
        ),
        (
            "too many token ids",
            json!({ "model": WORKLOAD, "input": vec![101; MAX_SEQ_LEN + 1] }).to_string().into_bytes(),
            400,
            Some("input"),
            "tokens long",
        ),
        (
            "a token id out of range",
            json!({ "model": WORKLOAD, "input": [[101, 102], [101, 40000, 102]] }).to_string().into_bytes(),
            400,
            Some("input"),
            "`input[1]` holds 40000",
        ),
        (
            "a negative token id",
            json!({ "model": WORKLOAD, "input": [101, -1, 102] }).to_string().into_bytes(),
            400,
            Some("input"),
            "holds -1",
        ),
        (
            "empty token ids",
            json!({ "model": WORKLOAD, "input": [[]] }).to_string().into_bytes(),
            400,
            Some("input"),
            "has no tokens",
        ),
        (
            "too many inputs",
            json!({ "model": WORKLOAD, "input": vec!["a"; 2049] }).to_string().into_bytes(),
            400,
            Some("input"),
            "at most 2048",
        ),
        (
            "other dimensions",
            json!({ "model": WORKLOAD, "input": "x", "dimensions": 64 }).to_string().into_bytes(),
            400,
            Some("dimensions"),
            "must be 384",
        ),
        (
            "an unknown encoding",
            json!({ "model": WORKLOAD, "input": "x", "encoding_format": "int8" }).to_string().into_bytes(),
            400,
            Some("encoding_format"),
            "\"float\" or \"base64\"",
        ),
        (
            "a user that is not text",
            json!({ "model": WORKLOAD, "input": "x", "user": 3 }).to_string().into_bytes(),
            400,
            Some("user"),
            "must be a string",
        ),
        ("an oversized body", vec![b' '; served::MAX_BODY_BYTES + 1], 413, None, "larger than"),
    ];
    for (what, body, status, param, message) in cases {
        let answer = send(addr, "POST", "/v1/embeddings", &[("Content-Type", "application/json")], &body);
        assert_eq!(answer.status, status, "{what}: {}", answer.body);
        let error = &answer.json()["error"];
        assert_eq!(error["param"], param.map_or(Value::Null, Value::from), "{what}: {error}");
        let text = error["message"].as_str().unwrap();
        assert!(text.contains(message), "{what}: {text:?} does not say {message:?}");
        assert!(error["type"].is_string(), "{what}");
    }
    for (method, path, status) in
        [("GET", "/v1/embeddings", 405), ("POST", "/v1/completions", 404), ("GET", "/nowhere", 404)]
    {
        let answer = send(addr, method, path, &[], b"");
        assert_eq!(answer.status, status, "{method} {path}");
        assert!(answer.json()["error"]["message"].is_string());
    }
    assert_eq!(send(addr, "GET", "/health", &[], b"").json()["status"], "ok");
    let models = send(addr, "GET", "/v1/models", &[], b"").json();
    assert_eq!(models["data"][0]["id"], WORKLOAD);
    // Nothing bad reached the encoder, and the server still embeds.
    assert_eq!(metric(addr, "monogen_embedded_sentences_total"), 0.0);
    assert_eq!(vectors(&post(addr, "/v1/embeddings", &json!({ "model": WORKLOAD, "input": "x" }))).len(), 1);

    let keyed = Running::start(model_dir("all-minilm-l6-v2").unwrap(), Some("k"));
    let body = json!({ "model": WORKLOAD, "input": "x" }).to_string();
    let answer = send(keyed.addr(), "POST", "/v1/embeddings", &[], body.as_bytes());
    assert_eq!(answer.status, 401);
    let answer =
        send(keyed.addr(), "POST", "/v1/embeddings", &[("Authorization", "Bearer k")], body.as_bytes());
    assert_eq!(answer.status, 200, "{}", answer.body);
}

#[test]
fn a_full_queue_answers_429_and_the_requests_of_clients_that_left_are_not_embedded() {
    let Some(dir) = model_dir("all-minilm-l6-v2") else { return };
    let server = Running::start(dir, None);
    let addr = server.addr();
    // Sentences of 64 tokens: a batch of MAX_BATCH of them takes a while, and the requests
    // sent meanwhile, one sentence each, fill the queue's MAX_QUEUE places.
    let sentence: Vec<u32> =
        std::iter::once(101).chain(std::iter::repeat_n(2_000, 62)).chain([102]).collect();
    let body = json!({ "model": WORKLOAD, "input": sentence });
    let sent = MAX_BATCH + MAX_QUEUE + 32;
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..sent).map(|_| s.spawn(|| post(addr, "/v1/embeddings", &body))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let refused: Vec<&Answer> = answers.iter().filter(|a| a.status == 429).collect();
    assert!(!refused.is_empty(), "none of {sent} requests sent at once was refused");
    for answer in &refused {
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert_eq!(answer.json()["error"]["type"], "rate_limit_error");
    }
    let served = answers.iter().filter(|a| a.status == 200).count();
    assert_eq!(served + refused.len(), sent, "every answer is 200 or 429");
    assert_eq!(metric(addr, "monogen_embedded_sentences_total"), served as f64);

    // While a request of two batches runs, clients send requests and leave before their
    // turn: theirs are not embedded.
    let before = metric(addr, "monogen_embedded_sentences_total");
    let leavers = MAX_QUEUE / 2;
    std::thread::scope(|s| {
        let long = s.spawn(|| {
            let input = vec![&sentence; 2 * MAX_BATCH];
            post(addr, "/v1/embeddings", &json!({ "model": WORKLOAD, "input": input }))
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while metric(addr, "monogen_running_sentences") == 0.0 {
            assert!(Instant::now() < deadline, "the long request never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        for _ in 0..leavers {
            s.spawn(|| {
                let text = body.to_string();
                let mut stream = TcpStream::connect(addr).unwrap();
                write!(
                    stream,
                    "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{text}",
                    text.len()
                )
                .unwrap();
                std::thread::sleep(Duration::from_millis(20));
            });
        }
        assert_eq!(vectors(&long.join().unwrap()).len(), 2 * MAX_BATCH);
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(addr, "monogen_queue_depth") > 0.0 || metric(addr, "monogen_running_sentences") > 0.0 {
        assert!(Instant::now() < deadline, "the queue did not empty");
        std::thread::sleep(Duration::from_millis(20));
    }
    let embedded = metric(addr, "monogen_embedded_sentences_total") - before - (2 * MAX_BATCH) as f64;
    assert_eq!(embedded, 0.0, "{embedded} of {leavers} requests whose clients left were embedded");
}

#[test]
fn stopping_answers_the_requests_taken() {
    let Some(dir) = model_dir("all-minilm-l6-v2") else { return };
    let server = Running::start(dir, None);
    let addr = server.addr();
    let input: Vec<&str> = SENTENCES.iter().cycle().take(4 * MAX_BATCH).copied().collect();
    let answer = std::thread::scope(|s| {
        let request = s.spawn(|| post(addr, "/v1/embeddings", &json!({ "model": WORKLOAD, "input": input })));
        let deadline = Instant::now() + Duration::from_secs(30);
        while metric(addr, "monogen_running_sentences") == 0.0 && !request.is_finished() {
            assert!(Instant::now() < deadline, "the request never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut server = server;
        server.0.take().unwrap().stop();
        request.join().unwrap()
    });
    assert_eq!(vectors(&answer).len(), 4 * MAX_BATCH);
    assert!(TcpStream::connect(addr).is_err(), "it no longer listens");
}

/// The binary's `serve` stops on SIGTERM and on SIGINT as docs/serving.md says: it stops taking
/// connections, answers the request it took in full, and exits 0 having said so. Without its
/// handler the process would die of the signal with the request unanswered.
#[test]
fn the_binary_answers_the_requests_taken_then_exits_on_sigterm_and_sigint() {
    let Some(dir) = model_dir("all-minilm-l6-v2") else { return };
    let binary = monogen_tests::build_copy(WORKLOAD);
    for signal in ["TERM", "INT"] {
        let server = ServeProcess::start(&binary, &dir);
        let addr = server.addr;
        // A few sentences: the copy is an unoptimised build, which embeds about two a second.
        let input: Vec<&str> = SENTENCES.iter().cycle().take(8).copied().collect();
        let answer = std::thread::scope(|s| {
            let request =
                s.spawn(|| post(addr, "/v1/embeddings", &json!({ "model": WORKLOAD, "input": input })));
            let deadline = Instant::now() + Duration::from_secs(30);
            while metric(addr, "monogen_running_sentences") == 0.0 && !request.is_finished() {
                assert!(Instant::now() < deadline, "SIG{signal}: the request never ran");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(!request.is_finished(), "SIG{signal}: the request was answered before the signal");
            server.signal(signal);
            request.join().unwrap()
        });
        assert_eq!(answer.status, 200, "SIG{signal}: {}", answer.body);
        assert_eq!(vectors(&answer).len(), input.len(), "SIG{signal}: the request taken is answered");
        server.assert_stopped(signal);
    }
}

#[test]
fn the_openai_python_client_gets_embeddings() {
    let Some(dir) = model_dir("all-minilm-l6-v2") else { return };
    let Some(python) = monogen_tests::python_with_openai("the_openai_python_client_gets_embeddings") else {
        return;
    };
    let want = alone(&dir, &SENTENCES[..2]);
    let server = Running::start(dir, Some("key-1"));
    let script = workspace_root().join("tests/clients/openai_embeddings.py");
    let output = Command::new(&python)
        .arg(&script)
        .args([
            &format!("http://{}/v1", server.addr()),
            WORKLOAD,
            "key-1",
            &json!(SENTENCES[..2]).to_string(),
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let got: Value = serde_json::from_slice(&output.stdout).unwrap();
    let as_vectors = |v: &Value| -> Vec<Vec<f32>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_array().unwrap().iter().map(|f| f.as_f64().unwrap() as f32).collect())
            .collect()
    };
    let default = as_vectors(&got["default"]["vectors"]);
    assert_eq!(default.len(), 2);
    for (i, vector) in default.iter().enumerate() {
        assert_close(vector, &want[i], SENTENCES[i]);
    }
    assert_eq!(got["default"]["indices"], json!([0, 1]));
    assert_eq!(got["default"]["model"], WORKLOAD);
    assert_close(&as_vectors(&got["float"]["vectors"])[0], &want[0], "encoding_format float");
    assert_eq!(got["errors"]["unknown_model"]["status"], 404);
    assert_eq!(got["errors"]["empty_string"]["status"], 400);
    assert_eq!(got["errors"]["dimensions"]["status"], 400);
    assert_eq!(got["wrong_key"], 401);
}
