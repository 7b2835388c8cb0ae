//! What fuzzing found stays found: every input of the committed corpus (`fuzz/corpus/<target>/`)
//! and every regression input (`fuzz/regressions/<target>/`, where `fuzz/run.sh` copies each
//! crash it finds) runs here through the code its fuzz target calls (the workload parser; the
//! weight loaders of f32, int8, int4, bf16, packing and BERT crates; the tokenizer.json
//! readers; the chat template renderer; the server's handling of raw HTTP requests), as an
//! ordinary test, and must return (a value or an error) without a panic. The workload
//! corpus must use every key that docs/workload.md documents, so that the fuzzer starts from
//! each table and key.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use monogen::workload::WorkloadSource;
use monogen_tests::workspace_root;

/// The files of `fuzz/corpus/<target>` and `fuzz/regressions/<target>` (which may not exist),
/// and for the weight loaders those of `fuzz/corpus/safetensors`, which fuzz/run.sh gives them
/// as seeds too.
fn inputs(target: &str) -> Vec<PathBuf> {
    let mut dirs = vec![("corpus", target), ("regressions", target)];
    if target.ends_with("_weights") {
        dirs.push(("corpus", "safetensors"));
    }
    let mut files = Vec::new();
    for (folder, name) in dirs {
        let dir = workspace_root().join("fuzz").join(folder).join(name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            assert!(folder == "regressions", "{} is missing", dir.display());
            continue;
        };
        files.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file()));
    }
    files.sort();
    files
}

/// Runs `body` on every input of `target`; fails naming each input that panicked.
fn replay(target: &str, body: impl Fn(&Path, &[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no inputs for fuzz target {target}");
    let panicked: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).unwrap();
            catch_unwind(AssertUnwindSafe(|| body(path, &data))).is_err()
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(panicked.is_empty(), "fuzz target {target} panics on: {panicked:#?}");
    eprintln!("{target}: {} inputs replayed", files.len());
}

/// The body of fuzz/fuzz_targets/workload.rs.
fn parse_workload(_: &Path, data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(diagnostics) = WorkloadSource::from_text("fuzz.toml", text).parse() {
        for d in diagnostics {
            let _ = d.render();
            let _ = d.render_styled();
        }
    }
}

/// `data` written to a file of a fresh temporary directory, then `load` on it: the body of
/// each weight loader's target (fuzz/fuzz_targets/{safetensors,*_weights}.rs).
fn load_from_file(data: &[u8], load: impl FnOnce(&Path)) {
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("model.safetensors");
    std::fs::write(&file, data).unwrap();
    load(&file);
}

#[test]
fn every_workload_input_parses_or_is_rejected_without_a_panic() {
    replay("workload", parse_workload);
}

#[test]
fn every_weights_input_loads_or_is_rejected_without_a_panic() {
    replay("safetensors", |_, data| {
        load_from_file(data, |f| drop(stories260k_cpu_f32::weights::Weights::load(f)))
    });
    replay("int8_weights", |_, data| {
        load_from_file(data, |f| drop(stories260k_cpu_int8::weights::Weights::load(f)))
    });
    replay("int4_weights", |_, data| {
        load_from_file(data, |f| drop(stories260k_cpu_int4::weights::Weights::load(f)))
    });
    replay("bf16_weights", |_, data| {
        load_from_file(data, |f| drop(stories260k_cpu_bf16::weights::Weights::load(f)))
    });
    // The packing crate packs with AVX-512 as it loads: only where the CPU has it.
    match stories260k_cpu_bf16_bf16act::cpu::check() {
        Ok(()) => replay("packed_weights", |_, data| {
            load_from_file(data, |f| drop(stories260k_cpu_bf16_bf16act::weights::Weights::load(f)))
        }),
        Err(stories260k_cpu_bf16_bf16act::Error::UnsupportedCpu { missing, .. }) => {
            let missing: Vec<&str> = missing.split(", ").collect();
            monogen_tests::skip::cpu("fuzz_corpus: packed_weights replay", &missing);
        }
        Err(e) => panic!("{e}"),
    }
    replay("bert_weights", |_, data| {
        load_from_file(data, |f| drop(all_minilm_l6_v2_cpu_f32::weights::Weights::load(f)))
    });
}

/// The body of fuzz/fuzz_targets/tokenizer.rs.
#[test]
fn every_tokenizer_input_loads_or_is_rejected_without_a_panic() {
    replay("tokenizer", |_, data| {
        let temp = tempfile::tempdir().unwrap();
        std::fs::write(temp.path().join("tokenizer.json"), data).unwrap();
        if let Ok(tokenizer) = stories260k_cpu_f32::Tokenizer::load(temp.path()) {
            let _ = tokenizer.decode(&[1, 2, 3, 300, 511]);
        }
        if let Ok(tokenizer) = stories260k_cpu_f32::Tokenizer::load_with_encoder(temp.path())
            && let Ok(ids) = tokenizer.encode("Once upon a time, a cat sat.")
        {
            let _ = tokenizer.decode(&ids);
        }
        if let Ok(tokenizer) = all_minilm_l6_v2_cpu_f32::Tokenizer::load(temp.path()) {
            let _ = tokenizer.encode("A cat sat on the mat.");
        }
    });
}

/// The body of fuzz/fuzz_targets/chat_template.rs: a template's source, then optionally a line
/// `---` and the messages as JSON. Returns whether the template compiled and rendered.
fn render_chat_template(data: &[u8]) -> bool {
    use serde_json::{Map, Value, json};
    use stories260k_chat_cpu_f32::serve::ChatTemplate;
    let Ok(text) = std::str::from_utf8(data) else { return false };
    let (source, messages) = text.split_once("\n---\n").unwrap_or((text, ""));
    let messages: Value = serde_json::from_str(messages).unwrap_or_else(|_| {
        json!([
            { "role": "system", "content": "Be brief." },
            { "role": "user", "content": "Hi" },
            { "role": "assistant", "content": "Hello." },
            { "role": "user", "content": "Bye" },
        ])
    });
    let Ok(template) = ChatTemplate::new(source.to_string(), "<s>".into(), "</s>".into()) else {
        return false;
    };
    let with = template.render_with(&messages, true, &Map::new());
    let without = template.render_with(&messages, false, &Map::new());
    with.is_ok() && without.is_ok()
}

#[test]
fn every_chat_template_input_renders_or_is_refused_without_a_panic() {
    replay("chat_template", |_, data| {
        render_chat_template(data);
    });
}

/// The server of the `http` target (fuzz/fuzz_targets/http.rs): the chat crate's, on the real
/// stories260k, for the whole test process; `None` without the model.
fn http_server() -> Option<std::net::SocketAddr> {
    static ADDR: std::sync::OnceLock<Option<std::net::SocketAddr>> = std::sync::OnceLock::new();
    *ADDR.get_or_init(|| {
        use stories260k_chat_cpu_f32::serve::{Options, Server};
        let model = monogen_tests::model_dir("stories260k")?;
        let options = Options { model, host: "127.0.0.1".into(), port: 0, api_key: None };
        let server = Server::start(&options).unwrap();
        let addr = server.addr();
        // It serves until the test process ends.
        std::mem::forget(server);
        Some(addr)
    })
}

/// The request fuzz/fuzz_targets/http.rs writes after each input, which closes the connection
/// once the server has answered.
const LAST: &[u8] = b"GET /health HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n";

/// The body of fuzz/fuzz_targets/http.rs: the bytes and [`LAST`] written to a fresh loopback
/// connection of the server, read until it closes or is quiet for a second; then the server must
/// still answer. Returns what it answered, checked.
fn send_raw_http(addr: std::net::SocketAddr, data: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let mut stream = std::net::TcpStream::connect(addr).expect("the server takes connections");
    stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = stream.write_all(data).and_then(|()| stream.write_all(LAST));
    stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 16384];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(_) => break,
        }
        assert!(started.elapsed() < Duration::from_secs(60), "an answer that does not end");
    }
    drop(stream);
    let mut health = std::net::TcpStream::connect(addr).expect("the server still takes connections");
    health.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    health.write_all(LAST).unwrap();
    let mut alive = Vec::new();
    let _ = health.read_to_end(&mut alive);
    assert!(
        alive.starts_with(b"HTTP/1.1 200"),
        "the server stopped answering: {:?}",
        String::from_utf8_lossy(&alive)
    );
    check_http_answer(&answer);
    answer
}

/// The answers in `bytes`, in order, as (status, head, body): each head up to its blank line,
/// then a body of its Content-Length, or its chunks; an answer cut short ends the list.
fn answers(bytes: &[u8]) -> Vec<(u16, String, Vec<u8>)> {
    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some(end) = find(rest, b"\r\n\r\n") else { break };
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        rest = &rest[end + 4..];
        let lower = head.to_ascii_lowercase();
        let mut body = Vec::new();
        if lower.contains("\r\ntransfer-encoding: chunked") {
            loop {
                let Some(line) = find(rest, b"\r\n") else { return out };
                let size = std::str::from_utf8(&rest[..line])
                    .ok()
                    .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
                let Some(size) = size else { return out };
                rest = &rest[line + 2..];
                if rest.len() < size + 2 {
                    return out;
                }
                body.extend_from_slice(&rest[..size]);
                rest = &rest[size + 2..];
                if size == 0 {
                    break;
                }
            }
        } else {
            let length = lower
                .lines()
                .find_map(|l| l.strip_prefix("content-length: ").and_then(|n| n.trim().parse::<usize>().ok()))
                .unwrap_or(0);
            // An answer to HEAD has the length of the body it leaves out.
            let length = if rest.starts_with(b"HTTP/1.") { 0 } else { length };
            if rest.len() < length {
                return out;
            }
            body.extend_from_slice(&rest[..length]);
            rest = &rest[length..];
        }
        out.push((status, head, body));
    }
    out
}

/// The checks of fuzz/fuzz_targets/http.rs: what the server answered has HTTP status lines,
/// no 5xx, and a well-formed body where it says JSON (an error's an OpenAI error object).
fn check_http_answer(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    assert!(bytes.is_empty() || text.starts_with("HTTP/1."), "not an HTTP answer: {text:?}");
    for (status, head, body) in answers(bytes) {
        assert!(head.starts_with("HTTP/1.") && (100..500).contains(&status), "a 5xx or no status: {text:?}");
        if head.to_ascii_lowercase().contains("\r\ncontent-type: application/json") {
            let value: serde_json::Value = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("a JSON answer that is not JSON ({e}): {text:?}"));
            if status >= 400 {
                assert!(
                    value["error"]["message"].is_string(),
                    "an error that is not an OpenAI error object: {text:?}"
                );
            }
        }
    }
}

#[test]
fn every_http_input_is_answered_or_closed_without_a_5xx() {
    let Some(addr) = http_server() else { return };
    replay("http", |_, data| {
        send_raw_http(addr, data);
    });
}

/// The HTTP seeds reach the handlers: each valid request among them is answered 200, and each
/// of the others with the 4xx its name says, followed by the 200 of the request that closes
/// the connection, except where the server closes it first (a body it will not read, a request
/// it cannot parse).
#[test]
fn the_http_seeds_reach_the_server_s_answers() {
    let Some(addr) = http_server() else { return };
    let dir = workspace_root().join("fuzz/corpus/http");
    let status = |name: &str| {
        let answer = send_raw_http(addr, &std::fs::read(dir.join(name)).unwrap());
        let codes: Vec<String> = answers(&answer).iter().map(|(status, _, _)| status.to_string()).collect();
        codes.join(" ")
    };
    let mut wrong = Vec::new();
    for (name, want) in [
        ("completion", "200 200"),
        ("completion_ids_stop_seed", "200 200"),
        ("completion_stream_usage", "200 200"),
        ("chat", "200 200"),
        ("chat_stream_priority", "200 200"),
        ("chunked", "200 200"),
        ("bearer", "200 200"),
        ("http10_no_host", "200"),
        ("models_health_metrics_pipelined", "200 200 200 200"),
        ("wrong_method_and_route", "405 404 200"),
        ("unsupported_fields", "400 200"),
        ("wrong_types", "400 200"),
        ("bad_json", "400 200"),
        ("wrong_content_type", "400 200"),
        ("huge_length", "413"),
        ("short_body", ""),
        ("garbage_request_line", "400"),
    ] {
        let got = status(name);
        if got != want {
            wrong.push(format!("{name}: {got}, not {want}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The chat template seeds are the templates of tests/fixtures/chat_templates/ with a
/// conversation each renders, so that the fuzzer starts past the parser.
#[test]
fn the_chat_template_seeds_render() {
    let dir = workspace_root().join("fuzz/corpus/chat_template");
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    seeds.sort();
    assert!(seeds.len() >= 9, "{seeds:?}");
    for seed in seeds {
        assert!(render_chat_template(&std::fs::read(&seed).unwrap()), "{} does not render", seed.display());
    }
}

/// The tokenizer seeds are valid tokenizers (a LLaMA-style BPE with byte fallback, the BPE
/// that `monogen synth-weights` writes, a BERT WordPiece), so that the fuzzer starts from inputs
/// that reach past the reader's first checks.
#[test]
fn the_tokenizer_seeds_load() {
    let dir = workspace_root().join("fuzz/corpus/tokenizer");
    for (file, bert) in
        [("bpe_byte_fallback.json", false), ("synth_bpe.json", false), ("wordpiece.json", true)]
    {
        let temp = tempfile::tempdir().unwrap();
        std::fs::copy(dir.join(file), temp.path().join("tokenizer.json")).unwrap();
        if bert {
            all_minilm_l6_v2_cpu_f32::Tokenizer::load(temp.path()).unwrap_or_else(|e| panic!("{file}: {e}"));
        } else {
            let tokenizer = stories260k_cpu_f32::Tokenizer::load_with_encoder(temp.path())
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            tokenizer.encode("Once upon a time").unwrap_or_else(|e| panic!("{file}: {e}"));
        }
    }
}

/// A panicking body is caught and named: the replay can fail.
#[test]
#[should_panic(expected = "fuzz target workload panics on")]
fn a_panicking_input_fails_the_replay() {
    replay("workload", |path, _| assert!(!path.to_string_lossy().contains("syntax-error")));
}

/// The keys in the first column of docs/workload.md's tables.
fn documented_keys() -> BTreeSet<String> {
    let text = std::fs::read_to_string(workspace_root().join("docs/workload.md")).unwrap();
    let mut keys = BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap_or_default();
        keys.extend(first.split('`').skip(1).step_by(2).map(str::to_string));
    }
    keys
}

#[test]
fn the_workload_corpus_uses_every_documented_key() {
    let keys = documented_keys();
    assert!(keys.len() >= 40 && keys.contains("batch_wait_ms") && keys.contains("qkv_bias"), "{keys:?}");
    let corpus: Vec<String> = inputs("workload")
        .iter()
        .map(|p| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned())
        .collect();
    let uses = |key: &str| {
        corpus.iter().any(|text| {
            text.lines().any(|line| {
                let line = line.trim_start().trim_start_matches('{');
                line.starts_with(&format!("{key} ="))
                    || line.ends_with(&format!(".{key}]"))
                    || line.contains(&format!(", {key} ="))
                    || line.contains(&format!("{{ {key} ="))
            })
        })
    };
    let missing: Vec<&String> = keys.iter().filter(|k| !uses(k)).collect();
    assert!(missing.is_empty(), "no workload in fuzz/corpus/workload sets {missing:?}");
}
