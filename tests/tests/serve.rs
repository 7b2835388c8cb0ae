//! Batched decoding and the generated server (`stories260k-serve-cpu-f32`, a batch of 4 and 8 KV
//! slots, and its chat twin `stories260k-chat-cpu-f32`), on the real stories260k model:
//!
//! - sequences run together in batched steps, through the engine's continuous batching and
//!   through the HTTP server, give the tokens each gives alone, token for token, except after a
//!   step where the two best logits of the lone run were within `TIE` of each other;
//! - a more urgent class is served first, and a displaced sequence resumes unchanged;
//! - the server speaks OpenAI's API (plain HTTP here, the `openai` Python client in
//!   `openai_client.rs`): streaming framing, usage, stop strings, chat templates, and a 4xx
//!   error object for every bad request; a full queue answers 429, a client that goes away frees
//!   its place, SIGTERM lets running requests finish.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use chatty::serve::ChatTemplate;
use monogen_tests::http::{Answer, ServeProcess, metric, parse_answer, post, send};
use monogen_tests::{build_copy, model_dir, workspace_root};
use serde_json::{Value, json};
use served::engine::{Engine, Event, Request};
use served::serve::{Options, Server};
use served::{GenerateParams, MAX_BATCH, Model, Run, Sequence, StopReason, Tokenizer, VOCAB_SIZE, WORKLOAD};
use stories260k_chat_cpu_f32 as chatty;
use stories260k_serve_cpu_f32 as served;

/// Two logits closer than this are a tie, which a batched run may break the other way.
const TIE: f32 = 1e-3;

fn model() -> Option<&'static Arc<Model>> {
    static MODEL: OnceLock<Option<Arc<Model>>> = OnceLock::new();
    MODEL.get_or_init(|| model_dir("stories260k").map(|dir| Arc::new(Model::load(dir).unwrap()))).as_ref()
}

/// Greedy tokens of `prompt` run alone, each with the gap between the two best logits it was
/// picked by; stops after EOS or `max_tokens`.
fn alone(model: &Model, prompt: &[u32], max_tokens: usize) -> Vec<(u32, f32)> {
    let mut session = model.session();
    let mut logits = session.prefill(prompt).unwrap().to_vec();
    let mut out = Vec::new();
    loop {
        let (best, gap) = top2(&logits);
        out.push((best, gap));
        if best == 2 || out.len() == max_tokens || session.position() == served::MAX_SEQ_LEN {
            return out;
        }
        logits = session.decode(best).unwrap().to_vec();
    }
}

fn top2(logits: &[f32]) -> (u32, f32) {
    let mut best = (0, f32::NEG_INFINITY);
    let mut second = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l > best.1 {
            second = best.1;
            best = (i as u32, l);
        } else if l > second {
            second = l;
        }
    }
    (best.0, best.1 - second)
}

/// `got` equals the lone run's tokens, or departs from them only at a tie.
fn assert_same_tokens(got: &[u32], alone: &[(u32, f32)], what: &str) {
    for (i, (&g, &(a, gap))) in got.iter().zip(alone).enumerate() {
        if g != a {
            assert!(gap < TIE, "{what}: token {i} is {g}, alone {a}, whose lead of {gap} is no tie");
            return;
        }
    }
    assert_eq!(got.len(), alone.len(), "{what}: {} tokens, alone {}", got.len(), alone.len());
}

/// The served text `got` of `prompt` equals the text of the lone run's greedy tokens, or, where
/// that run met a tie, that of its tokens before the tie followed by anything.
fn assert_text_as_alone(
    decode: impl Fn(&[u32]) -> String,
    prompt: &[u32],
    max_tokens: usize,
    got: &str,
    what: &str,
) {
    let run = alone(model().unwrap(), prompt, max_tokens);
    let tokens: Vec<u32> = run.iter().map(|&(t, _)| t).collect();
    match run.iter().position(|&(_, gap)| gap < TIE) {
        None => assert_eq!(got, decode(&tokens), "{what}"),
        Some(tie) => assert!(
            got.starts_with(&decode(&tokens[..tie])),
            "{what}: {got:?} departs before the tie at {tie}"
        ),
    }
}

fn prompts(model_dir: &std::path::Path) -> Vec<Vec<u32>> {
    let tokenizer = Tokenizer::load_with_encoder(model_dir).unwrap();
    [
        "Once upon a time",
        "Lily and Ben went to the park. They saw a big dog",
        "The little bird",
        "One day, a boy named Tim found a shiny red ball in the garden. He wanted to show it to his mom, so he ran",
        "Sue had a cat",
        "There was a tree",
        "Mom said",
        "The sun was hot and the children wanted to swim",
    ]
    .iter()
    .map(|text| tokenizer.encode(text).unwrap())
    .collect()
}

#[test]
fn batched_steps_give_each_sequence_its_tokens_alone() {
    let (Some(model), Some(dir)) = (model(), model_dir("stories260k")) else { return };
    let prompts = &prompts(&dir)[..MAX_BATCH];
    let steps = 40;
    let lone: Vec<_> = prompts.iter().map(|p| alone(model, p, steps)).collect();

    // The prompts read together in one step, then a decode step of all of them at a time;
    // the second sequence joins a step late, beside the others' decode rows.
    let mut batch = model.batch();
    let mut sequences: Vec<Sequence> = prompts.iter().map(|_| Sequence::new()).collect();
    let mut next: Vec<Vec<u32>> = prompts.to_vec();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    for step in 0..steps + 1 {
        let members: Vec<usize> = (0..prompts.len()).filter(|&i| step > 0 || i != 1).collect();
        let mut runs: Vec<Run<'_>> = Vec::new();
        let mut rest = sequences.iter_mut().enumerate().filter(|(i, _)| members.contains(i));
        for (i, sequence) in &mut rest {
            runs.push(Run { sequence, tokens: &next[i] });
        }
        let logits = batch.step(&mut runs).unwrap().to_vec();
        for (r, &i) in members.iter().enumerate() {
            let token = top2(&logits[r * VOCAB_SIZE..(r + 1) * VOCAB_SIZE]).0;
            got[i].push(token);
            next[i] = vec![token];
        }
    }
    for (i, (got, lone)) in got.iter().zip(&lone).enumerate() {
        let got = &got[..got.iter().position(|&t| t == 2).map_or(got.len(), |e| e + 1).min(steps)];
        assert_same_tokens(got, lone, &format!("sequence {i}"));
    }

    // A step beyond its bounds is refused, not run.
    let mut extra: Vec<Sequence> = (0..=MAX_BATCH).map(|_| Sequence::new()).collect();
    let mut runs: Vec<Run<'_>> = extra.iter_mut().map(|sequence| Run { sequence, tokens: &[1] }).collect();
    let e = batch.step(&mut runs).expect_err("too many runs").to_string();
    assert!(e.contains(&format!("a step runs 1 to {MAX_BATCH} sequences, not {}", MAX_BATCH + 1)), "{e}");
}

/// `Batch::generate` gives each prompt of a batch the tokens `Session::generate` gives it
/// alone, greedy (up to a tie) and sampled, with each one's own stop; a batch beyond MAX_BATCH
/// is refused.
#[test]
fn a_batch_generates_each_prompts_tokens_alone() {
    let (Some(model), Some(dir)) = (model(), model_dir("stories260k")) else { return };
    let all = prompts(&dir);
    let prompts: Vec<&[u32]> = all[..MAX_BATCH].iter().map(Vec::as_slice).collect();
    // the longer prompts fill the context first, so sequences leave the batch at different steps
    let greedy = GenerateParams { max_tokens: 500, ..GenerateParams::default() };
    let batched = model.batch().generate(&prompts, &greedy).unwrap();
    for (i, (g, prompt)) in batched.iter().zip(&prompts).enumerate() {
        let lone = alone(model, prompt, greedy.max_tokens);
        assert_same_tokens(&g.generated_ids, &lone, &format!("greedy sequence {i}"));
        assert_eq!(g.prompt_ids, *prompt);
        assert_eq!(g.decode_steps, g.generated_ids.len() - 1, "sequence {i}");
    }
    let stops: Vec<StopReason> = batched.iter().map(|g| g.stop).collect();
    assert!(stops.contains(&StopReason::ContextFull) && stops.contains(&StopReason::MaxTokens), "{stops:?}");

    let sampled = GenerateParams {
        max_tokens: 50,
        temperature: 0.9,
        top_p: 0.95,
        seed: 11,
        ..GenerateParams::default()
    };
    let batched = model.batch().generate(&prompts, &sampled).unwrap();
    for (i, (g, prompt)) in batched.iter().zip(&prompts).enumerate() {
        let lone = model.session().generate(prompt, &sampled, |_| true).unwrap();
        assert_eq!((&g.generated_ids, g.stop), (&lone.generated_ids, lone.stop), "sampled sequence {i}");
    }

    // No new token at all, as alone.
    let none = GenerateParams { max_tokens: 0, ..GenerateParams::default() };
    let batched = model.batch().generate(&prompts[..2], &none).unwrap();
    assert!(batched.iter().all(|g| g.generated_ids.is_empty() && g.stop == StopReason::MaxTokens));

    let too_many: Vec<&[u32]> = (0..=MAX_BATCH).map(|_| prompts[0]).collect();
    let e = model.batch().generate(&too_many, &greedy).expect_err("too many prompts").to_string();
    assert!(
        e.contains(&format!("a batch generates after 1 to {MAX_BATCH} prompts, not {}", MAX_BATCH + 1)),
        "{e}"
    );
    let e = model.batch().generate(&[&[1], &[]], &greedy).expect_err("an empty prompt").to_string();
    assert!(e.contains("empty"), "{e}");
}

/// The batched crate's binary runs `--batch N` copies of its prompt together (what `bench`
/// times to check a flip of a batched decoder end to end): each copy's tokens are the prompt's
/// alone, and a batch beyond MAX_BATCH is refused with the reason.
#[test]
fn the_binary_runs_a_batch_of_copies_of_its_prompt() {
    let Some(dir) = model_dir("stories260k") else { return };
    let run = |extra: &[&str]| {
        let mut command = Command::new(binary());
        command.arg("--model").arg(&dir).args(["--prompt", "Lily and Ben went to", "--max-tokens", "30"]);
        let out = command.args(extra).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for sampling in [&[][..], &["--temperature", "0.8", "--seed", "3"][..]] {
        let (code, alone, stderr) = run(&[&["--json"][..], sampling].concat());
        assert_eq!(code, Some(0), "{stderr}");
        let alone: Value = serde_json::from_str(&alone).unwrap();
        let (code, batch, stderr) = run(&[&["--json", "--batch", "3"][..], sampling].concat());
        assert_eq!(code, Some(0), "{stderr}");
        let batch: Value = serde_json::from_str(&batch).unwrap();
        assert_eq!(batch["batch"], 3);
        assert_eq!(batch["prompt_ids"], alone["prompt_ids"]);
        let sequences = batch["sequences"].as_array().unwrap();
        assert_eq!(sequences.len(), 3);
        for s in sequences {
            assert_eq!(
                (&s["generated_ids"], &s["text"], &s["stop"]),
                (&alone["generated_ids"], &alone["text"], &alone["stop"]),
                "{sampling:?}"
            );
        }
        let steps = batch["decode_steps"].as_u64().unwrap();
        assert_eq!(steps as usize, alone["generated_ids"].as_array().unwrap().len() - 1);
        assert!(
            batch["decode_ms"].as_f64().unwrap() > 0.0 && batch["prefill_ms"].as_f64().unwrap() > 0.0,
            "{batch}"
        );
    }
    // As text: each copy's whole text, a line each, and the batch's figures.
    let (code, text, stderr) = run(&["--batch", "2"]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() == 2 && lines[0] == lines[1] && lines[0].starts_with("Lily and Ben went to"),
        "{text}"
    );
    assert!(stderr.contains("[2 sequences of ") && stderr.contains("decode steps"), "{stderr}");
    for bad in ["0", &(MAX_BATCH + 1).to_string()] {
        let (code, _, stderr) = run(&["--batch", bad]);
        assert_eq!(code, Some(2), "--batch {bad}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "invalid batch: must be between 1 and {MAX_BATCH}, the most sequences this crate runs at once"
            )),
            "{stderr}"
        );
    }
}

/// Hands `requests` (prompt, max_tokens, class) to a new engine at once; returns each one's
/// tokens and stop, and the order in which they ended.
fn serve_on_engine(
    model: &Arc<Model>,
    requests: &[(Vec<u32>, usize, u8)],
) -> (Vec<(Vec<u32>, StopReason)>, Vec<usize>) {
    let engine = Engine::start(model.clone(), Default::default());
    let receivers: Vec<_> = requests
        .iter()
        .map(|(prompt, max_tokens, priority)| {
            let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
            let params =
                GenerateParams { max_tokens: *max_tokens, temperature: 0.0, ..GenerateParams::default() };
            engine.submit(Request { prompt: prompt.clone(), params, priority: *priority, events }).unwrap();
            receiver
        })
        .collect();
    collect(receivers)
}

fn collect(
    receivers: Vec<tokio::sync::mpsc::UnboundedReceiver<Event>>,
) -> (Vec<(Vec<u32>, StopReason)>, Vec<usize>) {
    let mut out = vec![(Vec::new(), StopReason::Cancelled); receivers.len()];
    let mut order = Vec::new();
    let mut receivers: Vec<_> = receivers.into_iter().map(Some).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while order.len() < out.len() {
        assert!(Instant::now() < deadline, "the engine did not finish in time");
        let mut idle = true;
        for (i, receiver) in receivers.iter_mut().enumerate() {
            let Some(r) = receiver else { continue };
            while let Ok(event) = r.try_recv() {
                idle = false;
                match event {
                    Event::Token(t) => out[i].0.push(t),
                    Event::Done(stop) => {
                        out[i].1 = stop;
                        order.push(i);
                        *receiver = None;
                        break;
                    }
                    Event::Failed(e) => panic!("request {i} failed: {e}"),
                }
            }
        }
        if idle {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    (out, order)
}

#[test]
fn the_engine_serves_concurrent_requests_as_each_runs_alone() {
    let (Some(model), Some(dir)) = (model(), model_dir("stories260k")) else { return };
    // 8 requests for 4 places: the last ones wait with their KV caches, and run as places free.
    let requests: Vec<_> = prompts(&dir).into_iter().enumerate().map(|(i, p)| (p, 10 + 13 * i, 0)).collect();
    let (out, _) = serve_on_engine(model, &requests);
    for (i, ((tokens, stop), (prompt, max_tokens, _))) in out.iter().zip(&requests).enumerate() {
        let lone = alone(model, prompt, *max_tokens);
        assert_same_tokens(tokens, &lone, &format!("request {i}"));
        let want = if tokens.last() == Some(&2) { StopReason::Eos } else { StopReason::MaxTokens };
        assert_eq!(*stop, want, "request {i}");
    }
}

#[test]
fn a_more_urgent_class_goes_first_and_the_displaced_resume_unchanged() {
    let (Some(model), Some(dir)) = (model(), model_dir("stories260k")) else { return };
    let prompts = prompts(&dir);
    let engine = Engine::start(model.clone(), Default::default());
    let submit = |prompt: &Vec<u32>, max_tokens, priority| {
        let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
        let params = GenerateParams { max_tokens, temperature: 0.0, ..GenerateParams::default() };
        engine.submit(Request { prompt: prompt.clone(), params, priority, events }).unwrap();
        receiver
    };
    // 8 long `batch` requests take all 8 KV slots; once the running ones have a token, 2
    // `interactive` ones arrive: they take the caches of the last two to arrive, and the places
    // in the batch of two running ones, which resume later where they stopped.
    // The first MAX_BATCH run; the others hold their caches and wait.
    let mut receivers: Vec<_> = prompts.iter().map(|p| submit(p, 300, 1)).collect();
    let mut first: Vec<Vec<u32>> = vec![Vec::new(); receivers.len()];
    let deadline = Instant::now() + Duration::from_secs(60);
    for (r, got) in receivers.iter_mut().zip(&mut first).take(MAX_BATCH) {
        loop {
            assert!(Instant::now() < deadline, "no first token");
            match r.try_recv() {
                Ok(Event::Token(t)) => {
                    got.push(t);
                    break;
                }
                Ok(other) => panic!("{other:?}"),
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }
    receivers.push(submit(&prompts[0], 20, 0));
    receivers.push(submit(&prompts[2], 20, 0));
    let (out, order) = collect(receivers);
    // Both urgent requests end before any long one that ran to its limit (rather than to EOS).
    let at = |i: usize| order.iter().position(|&o| o == i).unwrap();
    let full: Vec<usize> = (0..8).filter(|&i| out[i].1 == StopReason::MaxTokens).collect();
    assert!(full.len() >= 2, "long requests that ran to their limit: {full:?}");
    for i in full {
        assert!(at(8) < at(i) && at(9) < at(i), "{order:?}");
    }
    for (i, (tokens, _)) in out.iter().enumerate() {
        let (prompt, max_tokens) =
            if i < 8 { (&prompts[i], 300) } else { (&prompts[if i == 8 { 0 } else { 2 }], 20) };
        let tokens: Vec<u32> =
            if i < 8 { first[i].iter().chain(tokens).copied().collect() } else { tokens.clone() };
        assert_same_tokens(&tokens, &alone(model, prompt, max_tokens), &format!("request {i}"));
    }
}

// ---- HTTP ------------------------------------------------------------------------------------

/// A server on a loopback port, stopped when dropped.
/// A server started in this process, stopped when dropped.
struct Running {
    addr: SocketAddr,
    stop: Option<Box<dyn FnOnce()>>,
}

impl Running {
    /// `stories260k-serve-cpu-f32`'s server, which has no chat path.
    fn start(dir: PathBuf, api_key: Option<&str>) -> Running {
        let options =
            Options { model: dir, host: "127.0.0.1".into(), port: 0, api_key: api_key.map(str::to_string) };
        let server = Server::start(&options).unwrap();
        Running { addr: server.addr(), stop: Some(Box::new(move || server.stop())) }
    }

    /// `stories260k-chat-cpu-f32`'s server, which chats with the template its workload embeds.
    fn start_chat(dir: PathBuf, api_key: Option<&str>) -> Running {
        let options = chatty::serve::Options {
            model: dir,
            host: "127.0.0.1".into(),
            port: 0,
            api_key: api_key.map(str::to_string),
        };
        let server = chatty::serve::Server::start(&options).unwrap();
        Running { addr: server.addr(), stop: Some(Box::new(move || server.stop())) }
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop();
        }
    }
}

/// stories260k with a decoy chat template in its tokenizer_config.json, under target/: the
/// chat twin renders the ChatML template its workload embeds, so every chat answer below
/// would differ if it read the model directory's.
fn chat_model() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let source = model_dir("stories260k")?;
        let dir = workspace_root().join(format!("target/test-models/stories260k-chat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(source.join(file), dir.join(file)).unwrap();
        }
        let config = json!({
            "bos_token": "<decoy>",
            "eos_token": "</decoy>",
            "chat_template": "{{ bos_token }}decoy{% for message in messages %}{{ message['content'] }}{% endfor %}",
        });
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        std::fs::write(dir.join("chat_template.jinja"), "decoy {{ messages }}").unwrap();
        Some(dir)
    })
    .clone()
}

/// The text that `prompt_ids` run alone continues with, greedy.
fn alone_text(tokenizer: &Tokenizer, prompt_ids: &[u32], max_tokens: usize) -> (String, usize, &'static str) {
    let model = model().unwrap();
    let tokens: Vec<u32> = alone(model, prompt_ids, max_tokens).into_iter().map(|(t, _)| t).collect();
    let finish = if tokens.last() == Some(&2) { "stop" } else { "length" };
    (tokenizer.decode(&tokens).unwrap(), tokens.len(), finish)
}

#[test]
fn concurrent_greedy_completions_equal_the_sequences_run_alone() {
    let Some(dir) = model_dir("stories260k") else { return };
    let server = Running::start(dir.clone(), None);
    let addr = server.addr();
    let tokenizer = Tokenizer::load_with_encoder(&dir).unwrap();
    let texts = [
        "Once upon a time",
        "Lily and Ben went to the park.",
        "The little bird",
        "Sue had a cat",
        "Mom said",
        "There was a tree",
    ];
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                s.spawn(move || {
                    let body = json!({ "model": WORKLOAD, "prompt": text, "max_tokens": 30 + 5 * i, "temperature": 0 });
                    post(addr, "/v1/completions", &body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (answer, text)) in answers.iter().zip(texts).enumerate() {
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.header("content-type"), Some("application/json"));
        let body = answer.json();
        let prompt = tokenizer.encode(text).unwrap();
        let (want, n, finish) = alone_text(&tokenizer, &prompt, 30 + 5 * i);
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["model"], WORKLOAD);
        assert_eq!(body["choices"][0]["text"], want, "prompt {text:?}");
        assert_eq!(body["choices"][0]["finish_reason"], finish);
        assert_eq!(
            body["usage"],
            json!({ "prompt_tokens": prompt.len(), "completion_tokens": n, "total_tokens": prompt.len() + n })
        );
    }

    // Ids as the prompt, a seed with sampling, and a stop string.
    let ids = tokenizer.encode("Once upon a time").unwrap();
    let by_ids = post(
        addr,
        "/v1/completions",
        &json!({ "model": WORKLOAD, "prompt": ids, "max_tokens": 30, "temperature": 0 }),
    );
    assert_eq!(by_ids.json()["choices"][0]["text"], answers[0].json()["choices"][0]["text"]);
    let sampled = |seed: u64| {
        let body = json!({ "model": WORKLOAD, "prompt": "Once upon a time", "max_tokens": 40, "temperature": 1.0, "top_p": 0.9, "seed": seed });
        post(addr, "/v1/completions", &body).json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(sampled(7), sampled(7), "the same seed gives the same text");
    let stopped = post(
        addr,
        "/v1/completions",
        &json!({ "model": WORKLOAD, "prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop": [" little", "zzz"] }),
    );
    let body = stopped.json();
    assert_eq!(body["choices"][0]["text"], ", there was a", "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}

#[test]
fn streams_are_server_sent_events_that_end_with_done() {
    const WORKLOAD: &str = chatty::WORKLOAD;
    let (Some(dir), Some(chat)) = (model_dir("stories260k"), chat_model()) else { return };
    let server = Running::start_chat(chat, None);
    let addr = server.addr();
    let whole = post(
        addr,
        "/v1/completions",
        &json!({ "model": WORKLOAD, "prompt": "Once upon a time", "max_tokens": 25, "temperature": 0 }),
    );
    let streamed = post(
        addr,
        "/v1/completions",
        &json!({ "model": WORKLOAD, "prompt": "Once upon a time", "max_tokens": 25, "temperature": 0, "stream": true, "stream_options": { "include_usage": true } }),
    );
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.header("content-type"), Some("text/event-stream"));
    let events = streamed.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String =
        chunks.iter().filter_map(|c| c["choices"].get(0)).map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(text, whole.json()["choices"][0]["text"].as_str().unwrap());
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], whole.json()["usage"]);
    assert!(chunks[..chunks.len() - 2].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert!(chunks.iter().all(|c| c["object"] == "text_completion" && c["id"] == chunks[0]["id"]));

    // Chat: the model's template, the role in the first delta, and the same text streamed.
    let messages = json!([{ "role": "system", "content": "Tell a story." }, { "role": "user", "content": "Once upon a time" }]);
    let chat = post(
        addr,
        "/v1/chat/completions",
        &json!({ "model": WORKLOAD, "messages": messages, "max_tokens": 20, "temperature": 0 }),
    );
    assert_eq!(chat.status, 200, "{}", chat.body);
    let body = chat.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    let tokenizer = Tokenizer::load_with_encoder(&dir).unwrap();
    let rendered = "<|im_start|>system\nTell a story.<|im_end|>\n<|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n";
    let prompt = chatty::Tokenizer::load_with_encoder(&dir).unwrap().encode_as_is(rendered).unwrap();
    let (want, n, _) = alone_text(&tokenizer, &prompt, 20);
    assert_eq!(body["choices"][0]["message"]["content"], want);
    assert_eq!(body["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(body["usage"]["completion_tokens"], n);
    let streamed = post(
        addr,
        "/v1/chat/completions",
        &json!({ "model": WORKLOAD, "messages": messages, "max_tokens": 20, "temperature": 0, "stream": true }),
    );
    let events = streamed.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, want);
}

#[test]
fn every_bad_request_gets_an_openai_error_object() {
    const WORKLOAD: &str = chatty::WORKLOAD;
    let (Some(dir), Some(chat)) = (model_dir("stories260k"), chat_model()) else { return };
    let plain = Running::start(dir.clone(), None);
    let server = Running::start_chat(chat, None);
    let addr = server.addr();
    let ok = |extra: Value| {
        let mut body = json!({ "model": WORKLOAD, "prompt": "Once upon a time", "max_tokens": 4 });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body.to_string()
    };
    let long_prompt = "Once upon a time there was a dog. ".repeat(60);
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("POST", "/v1/completions", "{\"model\": ".into(), 400, "not valid JSON"),
        ("POST", "/v1/completions", "[1, 2]".into(), 400, "must be a JSON object"),
        (
            "POST",
            "/v1/completions",
            ok(json!({ "max_tokens": "9" })),
            400,
            "`max_tokens` must be a positive integer",
        ),
        (
            "POST",
            "/v1/completions",
            ok(json!({ "max_tokens": 0 })),
            400,
            "`max_tokens` is 0, and must be between 1 and",
        ),
        ("POST", "/v1/completions", ok(json!({ "max_tokens": 100000 })), 400, "`max_tokens` is 100000"),
        (
            "POST",
            "/v1/completions",
            ok(json!({ "temperature": "hot" })),
            400,
            "`temperature` must be a number",
        ),
        ("POST", "/v1/completions", ok(json!({ "temperature": 3 })), 400, "`temperature` is 3"),
        ("POST", "/v1/completions", ok(json!({ "top_p": 0 })), 400, "`top_p` is 0"),
        ("POST", "/v1/completions", ok(json!({ "stream": "yes" })), 400, "`stream` must be true or false"),
        ("POST", "/v1/completions", ok(json!({ "stop": [1] })), 400, "`stop` must be a string"),
        ("POST", "/v1/completions", ok(json!({ "seed": 1.5 })), 400, "`seed` must be an integer"),
        ("POST", "/v1/completions", ok(json!({ "n": 2 })), 400, "`n` is not supported"),
        (
            "POST",
            "/v1/completions",
            ok(json!({ "frobnicate": true })),
            400,
            "unrecognized request argument supplied: `frobnicate`",
        ),
        ("POST", "/v1/completions", ok(json!({ "model": "gpt-4" })), 404, "the model `gpt-4` does not exist"),
        ("POST", "/v1/completions", ok(json!({ "model": 3 })), 400, "`model` must be a string"),
        ("POST", "/v1/completions", ok(json!({ "prompt": 42 })), 400, "`prompt` must be a string"),
        (
            "POST",
            "/v1/completions",
            ok(json!({ "prompt": [1, 99999] })),
            400,
            "token id 99999 is outside the vocabulary",
        ),
        ("POST", "/v1/completions", ok(json!({ "prompt": ["a", "b"] })), 400, "one prompt per request"),
        (
            "POST",
            "/v1/completions",
            ok(json!({ "prompt": long_prompt })),
            400,
            "this model's context holds 512",
        ),
        (
            "POST",
            "/v1/completions",
            ok(json!({ "priority": "urgent" })),
            400,
            "unknown priority class `urgent`: this server has interactive, batch",
        ),
        (
            "POST",
            "/v1/completions",
            format!("{{\"model\": \"{WORKLOAD}\", \"prompt\": \"{}\"}}", "a".repeat(2 << 20)),
            413,
            "larger than",
        ),
        (
            "POST",
            "/v1/chat/completions",
            json!({ "model": WORKLOAD, "messages": [] }).to_string(),
            400,
            "`messages` is empty",
        ),
        (
            "POST",
            "/v1/chat/completions",
            json!({ "model": WORKLOAD, "messages": [{ "role": "wizard", "content": "hi" }] }).to_string(),
            400,
            "messages[0].role `wizard`",
        ),
        (
            "POST",
            "/v1/chat/completions",
            json!({ "model": WORKLOAD, "messages": [{ "role": "user", "content": 5 }] }).to_string(),
            400,
            "messages[0].content must be a string",
        ),
        ("GET", "/v1/completions", String::new(), 405, "does not take that method"),
        ("GET", "/v2/anything", String::new(), 404, "no such route"),
    ];
    for (method, path, body, status, message) in &cases {
        let answer = send(addr, method, path, &[("Content-Type", "application/json")], body.as_bytes());
        assert_eq!(
            answer.status,
            *status,
            "{method} {path} {}: {}",
            &body[..body.len().min(80)],
            answer.body
        );
        let error = &answer.json()["error"];
        let text = error["message"].as_str().unwrap_or_default();
        assert!(text.contains(message), "{path} {}: {text}", &body[..body.len().min(80)]);
        assert!(error["type"].is_string(), "{error}");
    }
    // A crate without a chat path says why it has none.
    let answer = post(
        plain.addr(),
        "/v1/chat/completions",
        &json!({ "model": served::WORKLOAD, "messages": [{ "role": "user", "content": "hi" }] }),
    );
    assert_eq!(answer.status, 404);
    let message = answer.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("(serving.chat is not set); use /v1/completions"), "{message}");
    // A crate that chats starts from a base model's directory too: its template is its own.
    let options = chatty::serve::Options { model: dir, host: "127.0.0.1".into(), port: 0, api_key: None };
    chatty::serve::Server::start(&options)
        .expect("the chat twin starts without a template in the folder")
        .stop();
    // After all of that, the server still answers.
    let answer =
        post(addr, "/v1/completions", &json!({ "model": WORKLOAD, "prompt": "Once", "max_tokens": 3 }));
    assert_eq!(answer.status, 200, "{}", answer.body);
    let health = send(addr, "GET", "/health", &[], b"");
    assert_eq!((health.status, health.json()), (200, json!({ "status": "ok" })));
    let models = send(addr, "GET", "/v1/models", &[], b"").json();
    assert_eq!(models["data"][0]["id"], WORKLOAD);
    let metrics = send(addr, "GET", "/metrics", &[], b"").body;
    for name in [
        "monogen_queue_depth",
        "monogen_running_sequences",
        "monogen_kv_cache_usage_ratio",
        "monogen_generation_tokens_per_second",
        "monogen_time_to_first_token_seconds_bucket",
        "monogen_inter_token_latency_seconds_count",
    ] {
        assert!(metrics.contains(name), "{name} missing from\n{metrics}");
    }
    assert!(
        metrics.contains("monogen_http_requests_total{endpoint=\"completions\",status=\"400\"}"),
        "{metrics}"
    );
}

#[test]
fn an_api_key_is_required_when_set() {
    let Some(dir) = model_dir("stories260k") else { return };
    let server = Running::start(dir, Some("s3cret"));
    let addr = server.addr();
    let body = json!({ "model": WORKLOAD, "prompt": "Once", "max_tokens": 2 }).to_string();
    let none = send(addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(none.status, 401);
    assert_eq!(none.json()["error"]["code"], "invalid_api_key");
    let wrong = send(addr, "POST", "/v1/completions", &[("Authorization", "Bearer nope")], body.as_bytes());
    assert_eq!(wrong.status, 401);
    let right = send(addr, "POST", "/v1/completions", &[("Authorization", "Bearer s3cret")], body.as_bytes());
    assert_eq!(right.status, 200, "{}", right.body);
    assert_eq!(send(addr, "GET", "/v1/models", &[], b"").status, 401);
    assert_eq!(send(addr, "GET", "/health", &[], b"").status, 200);
}

/// The value of an unlabelled metric.
#[test]
fn a_full_queue_answers_429_and_a_client_that_leaves_frees_its_place() {
    let Some(dir) = model_dir("stories260k") else { return };
    let server = Running::start(dir.clone(), None);
    let addr = server.addr();
    // 8 KV slots and 16 waiting places: of 40 long requests at once, some are turned away.
    let body = json!({ "model": WORKLOAD, "prompt": "Once upon a time", "max_tokens": 500, "temperature": 0, "priority": "batch" });
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..40).map(|_| s.spawn(|| post(addr, "/v1/completions", &body))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let refused: Vec<&Answer> = answers.iter().filter(|a| a.status == 429).collect();
    assert!(!refused.is_empty(), "no request was refused");
    for answer in &refused {
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert_eq!(answer.json()["error"]["type"], "rate_limit_error");
    }
    assert!(answers.iter().all(|a| a.status == 200 || a.status == 429));
    // At least the places waiting are taken (more where the engine admits some first).
    assert!(answers.iter().filter(|a| a.status == 200).count() >= served::MAX_QUEUE);

    // A streaming client that reads one event and goes away.
    let mut stream = TcpStream::connect(addr).unwrap();
    let body = json!({ "model": WORKLOAD, "prompt": "Once upon a time", "max_tokens": 500, "temperature": 0, "stream": true }).to_string();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        reader.read_line(&mut line).unwrap();
    }
    let cancelled = metric(addr, "monogen_requests_cancelled_total");
    drop(reader);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(addr, "monogen_requests_cancelled_total") == cancelled
        || metric(addr, "monogen_running_sequences") > 0.0
    {
        assert!(
            Instant::now() < deadline,
            "the request still runs after its client left: cancelled {} (before {cancelled}), running {}",
            metric(addr, "monogen_requests_cancelled_total"),
            metric(addr, "monogen_running_sequences")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The cache it left is emptied before another request takes it: every place, the freed
    // ones among them, gives a request its own tokens.
    let tokenizer = Tokenizer::load_with_encoder(&dir).unwrap();
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..served::KV_SLOTS)
            .map(|i| {
                s.spawn(move || {
                    let body = json!({ "model": WORKLOAD, "prompt": format!("Tom had {i} apples"), "max_tokens": 8, "temperature": 0 });
                    post(addr, "/v1/completions", &body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, answer) in answers.iter().enumerate() {
        let prompt = tokenizer.encode(&format!("Tom had {i} apples")).unwrap();
        let got = answer.json()["choices"][0]["text"].as_str().unwrap().to_string();
        assert_text_as_alone(|t| tokenizer.decode(t).unwrap(), &prompt, 8, &got, &format!("request {i}"));
    }
}

#[test]
fn chat_templates_render_as_transformers_renders_them() {
    let dir = workspace_root().join("tests/fixtures/chat_templates");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 3, "fixtures of at least three families in {}", dir.display());
    let mut checked = 0;
    for file in files {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let string = |key: &str| fixture[key].as_str().unwrap_or_default().to_string();
        let template = ChatTemplate::new(string("chat_template"), string("bos_token"), string("eos_token"))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (i, case) in fixture["cases"].as_array().unwrap().iter().enumerate() {
            let extra = case["extra"].as_object().cloned().unwrap_or_default();
            let agp = case["add_generation_prompt"].as_bool().unwrap_or(true);
            let rendered = template.render_with(&case["messages"], agp, &extra);
            if case["error"].as_bool() == Some(true) {
                assert!(
                    rendered.is_err(),
                    "{} case {i}: transformers refused it, we rendered {rendered:?}",
                    file.display()
                );
            } else {
                assert_eq!(
                    rendered.as_deref(),
                    Ok(case["expected"].as_str().unwrap()),
                    "{} case {i}",
                    file.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 9, "{checked} cases checked");
}

/// SIGTERM and SIGINT (Ctrl-C) each stop the server as docs/serving.md says: it stops taking
/// connections, the request it took streams to its end, and it exits 0 having said so. Without
/// the handler the process would die of the signal mid-stream, and this would fail.
#[test]
fn sigterm_and_sigint_let_running_requests_finish_then_exit() {
    let Some(dir) = model_dir("stories260k") else { return };
    for signal in ["TERM", "INT"] {
        stops_gracefully_on(binary(), &dir, signal);
    }
}

/// The binary of a copy of the crate, built once for the tests that run it.
fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| build_copy(WORKLOAD))
}

fn stops_gracefully_on(binary: &Path, dir: &Path, signal: &str) {
    let server = ServeProcess::start(binary, dir);
    let body = json!({ "model": WORKLOAD, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": true }).to_string();
    let mut stream = TcpStream::connect(server.addr).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut raw = Vec::new();
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        reader.read_line(&mut line).unwrap();
        raw.extend_from_slice(line.as_bytes());
    }
    server.signal(signal);
    reader.read_to_end(&mut raw).unwrap();
    let answer = parse_answer(&raw);
    let events = answer.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "SIG{signal}: the running request finished"
    );
    server.assert_stopped(signal);
}

#[test]
fn the_openai_python_client_talks_to_the_server() {
    const WORKLOAD: &str = chatty::WORKLOAD;
    let (Some(dir), Some(chat)) = (model_dir("stories260k"), chat_model()) else { return };
    let Some(python) = monogen_tests::python_with_openai("the_openai_python_client_talks_to_the_server")
    else {
        return;
    };
    let server = Running::start_chat(chat, Some("key-1"));
    let script = workspace_root().join("tests/clients/openai_client.py");
    let output = Command::new(&python)
        .arg(&script)
        .args([&format!("http://{}/v1", server.addr()), WORKLOAD, "key-1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let got: Value = serde_json::from_slice(&output.stdout).unwrap();

    let tokenizer = Tokenizer::load_with_encoder(&dir).unwrap();
    let prompt = tokenizer.encode("Once upon a time").unwrap();
    let (text, n, finish) = alone_text(&tokenizer, &prompt, 24);
    let usage =
        json!({ "prompt_tokens": prompt.len(), "completion_tokens": n, "total_tokens": prompt.len() + n });
    assert_eq!(got["models"], json!([WORKLOAD]));
    for key in ["completion", "completion_stream"] {
        assert_eq!(got[key]["text"], text, "{key}");
        assert_eq!(got[key]["finish_reason"], finish, "{key}");
        assert_eq!(got[key]["usage"]["total_tokens"], usage["total_tokens"], "{key}: {}", got[key]);
    }
    let rendered = "<|im_start|>system\nTell a story.<|im_end|>\n<|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n";
    let (content, _, _) = alone_text(
        &tokenizer,
        &chatty::Tokenizer::load_with_encoder(&dir).unwrap().encode_as_is(rendered).unwrap(),
        20,
    );
    assert_eq!(got["chat"]["role"], "assistant");
    assert_eq!(got["chat"]["content"], content);
    assert_eq!(got["chat_stream"]["content"], content);
    assert_eq!(got["chat_stream"]["roles"], json!(["assistant"]));
    assert_eq!(got["errors"]["unknown_model"]["status"], 404);
    assert_eq!(got["errors"]["max_tokens"]["status"], 400);
    assert_eq!(got["errors"]["priority_header"]["status"], 400);
    assert_eq!(got["wrong_key"], 401);
}

/// The chat twin speculates (`[speculation]`, prompt lookup): requests served together, whose
/// prompts repeat themselves so that drafts are kept, each get the tokens of their prompt run
/// alone by plain decoding, greedy (up to a tie) and sampled with a seed (exactly); drafted and
/// kept tokens show in /metrics, which the base crate's lacks.
#[test]
fn speculating_requests_equal_the_sequences_run_alone() {
    const WORKLOAD: &str = chatty::WORKLOAD;
    let (Some(dir), Some(plain)) = (model_dir("stories260k"), model()) else { return };
    const { assert!(chatty::DRAFT_TOKENS == 4 && chatty::MAX_BATCH == 4) };
    let server = Running::start_chat(dir.clone(), None);
    let addr = server.addr();
    let tokenizer = chatty::Tokenizer::load_with_encoder(&dir).unwrap();
    let story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. \
        One day, she saw a big, red ball.";
    let prompts: Vec<Vec<u32>> = [
        format!("{story} {story} Once upon a time, there was"),
        format!("{story} Lily and Ben went to the park. {story} One day, she"),
        "The cat sat. The dog ran. The cat sat. The dog ran. The cat sat. The".to_string(),
        format!("{story} {story} {story} Once upon"),
        "Tom had a red ball. Tom had a red ball. Tom had a".to_string(),
        format!("{story} Once upon a time, there was a little"),
    ]
    .iter()
    .map(|text| tokenizer.encode(text).unwrap())
    .collect();
    let complete = |prompt: &[u32], max_tokens: usize, temperature: f32, seed: u64| {
        post(
            addr,
            "/v1/completions",
            &json!({ "model": WORKLOAD, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": seed }),
        )
    };
    // Greedy and sampled, all at once: more requests than the batch holds.
    let cases: Vec<(usize, usize, f32, u64)> = (0..12)
        .map(|i| (i % prompts.len(), 20 + 7 * i, if i % 3 == 2 { 0.9 } else { 0.0 }, i as u64))
        .collect();
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&(p, max_tokens, temperature, seed)| {
                let prompt = &prompts[p];
                s.spawn(move || complete(prompt, max_tokens, temperature, seed))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (&(p, max_tokens, temperature, seed), answer) in cases.iter().zip(&answers) {
        assert_eq!(answer.status, 200, "{}", answer.body);
        let got = answer.json()["choices"][0]["text"].as_str().unwrap().to_string();
        let what = format!("prompt {p}, max_tokens {max_tokens}, temperature {temperature}, seed {seed}");
        if temperature == 0.0 {
            assert_text_as_alone(|t| tokenizer.decode(t).unwrap(), &prompts[p], max_tokens, &got, &what);
        } else {
            let params = GenerateParams { max_tokens, temperature, top_k: 0, top_p: 1.0, seed };
            let alone = plain.session().generate(&prompts[p], &params, |_| true).unwrap();
            assert_eq!(got, tokenizer.decode(&alone.generated_ids).unwrap(), "{what}");
        }
    }
    // A prompt that leaves 6 positions, asking for all of them (the server refuses more): the
    // drafts shrink to fit, and the answer has the tokens and usage of plain decoding.
    let mut long: Vec<u32> = Vec::new();
    while long.len() < chatty::MAX_SEQ_LEN - 6 {
        long.extend_from_slice(&prompts[0][1..]);
    }
    long.truncate(chatty::MAX_SEQ_LEN - 6);
    let answer = complete(&long, 6, 0.0, 0);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let body = answer.json();
    let params = GenerateParams { max_tokens: 6, ..Default::default() };
    let alone = plain.session().generate(&long, &params, |_| true).unwrap();
    assert_eq!(body["choices"][0]["text"], tokenizer.decode(&alone.generated_ids).unwrap());
    assert_eq!(body["usage"]["completion_tokens"], alone.generated_ids.len());

    let drafted = metric(addr, "monogen_speculation_drafted_tokens_total");
    let kept = metric(addr, "monogen_speculation_accepted_tokens_total");
    assert!(drafted >= 20.0 && kept >= 10.0 && kept <= drafted, "{drafted} drafted, {kept} kept");
    drop(server);

    let base = Running::start(dir, None);
    let text = send(base.addr(), "GET", "/metrics", &[], b"").body;
    assert!(text.contains("monogen_steps_total") && !text.contains("speculation"), "{text}");
}

/// The chat twin keeps finished requests' KV caches (`request.shared_prefix_len = 32`): a
/// request that starts with one's tokens reads only the rest of its prompt, and its tokens are
/// those of the prompt run alone, whether the requests come one after another or together,
/// whether a kept cache holds a longer start than the request shares (cut to it), or all of
/// its prompt (the last token is read again, for its logits). More distinct starts than KV
/// slots give the least recently used kept caches up; a cache left by a client that went away
/// is not reused as a start. The base crate has no prefix cache at all.
#[test]
fn prefix_cached_requests_equal_the_sequences_run_alone() {
    const WORKLOAD: &str = chatty::WORKLOAD;
    let Some(dir) = model_dir("stories260k") else { return };
    const { assert!(chatty::PREFIX_CACHE_MIN == 16 && chatty::KV_SLOTS == 8) };
    let server = Running::start_chat(dir.clone(), None);
    let addr = server.addr();
    let tokenizer = chatty::Tokenizer::load_with_encoder(&dir).unwrap();
    let shared = tokenizer
        .encode("Once upon a time, there was a little girl named Lily. She loved to play outside with her friends in the big park.")
        .unwrap();
    assert!(shared.len() >= 32, "{}", shared.len());
    let tails = ["One day, she saw a dog.", "Her mom said", "They went to the park and", "The sun was hot."];
    let prompt_of = |start: &[u32], tail: &str| -> Vec<u32> {
        let mut ids = start.to_vec();
        ids.extend(&tokenizer.encode(tail).unwrap()[1..]); // without its BOS
        ids
    };
    let check = |prompt: &[u32], max_tokens: usize, answer: &Answer| {
        assert_eq!(answer.status, 200, "{}", answer.body);
        let got = answer.json()["choices"][0]["text"].as_str().unwrap().to_string();
        assert_text_as_alone(
            |t| tokenizer.decode(t).unwrap(),
            prompt,
            max_tokens,
            &got,
            &format!("prompt {prompt:?}"),
        );
    };
    let complete = |prompt: &[u32], max_tokens: usize| {
        post(
            addr,
            "/v1/completions",
            &json!({ "model": WORKLOAD, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0 }),
        )
    };
    let hits = || metric(addr, "monogen_prefix_cache_hits_total");
    let reused = || metric(addr, "monogen_prefix_cache_reused_tokens_total");

    // One after another: the first reads everything, the others take its start.
    for (i, tail) in tails.iter().enumerate() {
        let prompt = prompt_of(&shared, tail);
        check(&prompt, 12, &complete(&prompt, 12));
        assert_eq!(hits(), i as f64, "after request {i}");
    }
    assert!(reused() >= 3.0 * shared.len() as f64, "{}", reused());
    // The last prompt again: its request's cache holds all of it, and all but its last token
    // are taken.
    let prompt = prompt_of(&shared, tails[3]);
    let before = reused();
    check(&prompt, 12, &complete(&prompt, 12));
    assert_eq!(reused() - before, (prompt.len() - 1) as f64);

    // Six at once that share the start, with four kept caches that hold it: each takes a copy
    // of the start, and the kept caches stay for the next (moved, the last two would miss).
    let before = hits();
    let together: Vec<Vec<u32>> =
        (0..6).map(|i| prompt_of(&shared, &format!("{} {i}", tails[i % 4]))).collect();
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = together.iter().map(|p| s.spawn(move || complete(p, 8))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (prompt, answer) in together.iter().zip(&answers) {
        check(prompt, 8, answer);
    }
    assert_eq!(hits() - before, 6.0, "every request that shares the start takes it");

    // Together, more than the KV slots, with two starts and the same prompts three times.
    let other =
        tokenizer.encode("The little bird sat on a tree and sang a song every morning for the cat.").unwrap();
    let prompts: Vec<Vec<u32>> =
        (0..12).map(|i| prompt_of(if i % 2 == 0 { &shared } else { &other }, tails[i % 4])).collect();
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts.iter().map(|p| s.spawn(move || complete(p, 10))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (prompt, answer) in prompts.iter().zip(&answers) {
        check(prompt, 10, answer);
    }

    // A client that goes away mid-request leaves its cache free, not kept: the next request
    // with a start of its own takes it, emptied, and gets its own tokens.
    let mut stream = TcpStream::connect(addr).unwrap();
    let gone = prompt_of(&other, "Then the cat ran");
    let body =
        json!({ "model": WORKLOAD, "prompt": gone, "max_tokens": 200, "temperature": 0, "stream": true })
            .to_string();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        reader.read_line(&mut line).unwrap();
    }
    drop(reader);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(addr, "monogen_running_sequences") > 0.0 {
        assert!(Instant::now() < deadline, "the request still runs after its client left");
        std::thread::sleep(Duration::from_millis(20));
    }
    let fresh = tokenizer.encode("A red car went down the hill, fast.").unwrap();
    check(&fresh, 10, &complete(&fresh, 10));
    for tail in tails {
        let prompt = prompt_of(&other, tail);
        check(&prompt, 10, &complete(&prompt, 10));
    }

    // More distinct starts than KV slots: the least recently used kept caches are given up.
    let evictions = metric(addr, "monogen_prefix_cache_evictions_total");
    for i in 0..12 {
        let start = tokenizer
            .encode(&format!("Story number {i}: a boy named Tim found a box under the bed."))
            .unwrap();
        let prompt = prompt_of(&start, tails[i % 4]);
        check(&prompt, 6, &complete(&prompt, 6));
    }
    assert!(metric(addr, "monogen_prefix_cache_evictions_total") - evictions >= 4.0);
    // Each of the 41 requests counted once, when it got its cache (not while it waited: 12
    // came together for 8 slots).
    assert_eq!(hits() + metric(addr, "monogen_prefix_cache_misses_total"), 41.0);
    assert!(metric(addr, "monogen_kv_cache_usage_ratio") <= 1.0);

    // The base crate generates no prefix cache.
    let plain = Running::start(dir, None);
    let text = send(plain.addr(), "GET", "/metrics", &[], b"").body;
    assert!(!text.contains("prefix_cache"), "{text}");
    let engine =
        std::fs::read_to_string(workspace_root().join("generated/stories260k-serve-cpu-f32/src/engine.rs"))
            .unwrap();
    assert!(!engine.contains("Kept") && !engine.contains("PREFIX_CACHE_MIN"));
}
