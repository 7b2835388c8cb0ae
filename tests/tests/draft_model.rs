//! Speculative decoding with a draft model (`stories260k-cpu-f32-draft-int4`: stories260k in
//! f32, whose draft model, generated into the crate's draft/, is the same checkpoint held in
//! int4) against plain decoding (`stories260k-cpu-f32`) on the real model: the same tokens,
//! greedy and sampled, the same stop and the same session afterwards, over several turns;
//! drafts kept; a server's engine (`stories260k-serve-cpu-f32-draft-int4`) drafting for each
//! sequence of a batch, with the tokens each gives alone; and a draft model directory of its own
//! read only with the target's tokenizer.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monogen_tests::{model_dir, workspace_root};
use stories260k_cpu_f32 as plain;
use stories260k_cpu_f32_draft_int4 as drafted;
use stories260k_serve_cpu_f32_draft_int4 as served;

/// Logits closer than this are a tie: a verification's rows and a decode step's row sum in
/// different orders, so a tie may break either way.
const TIE: f32 = 1e-4;

fn prompts(tokenizer: &plain::Tokenizer) -> Vec<Vec<u32>> {
    let mut prompts: Vec<Vec<u32>> = ["Once upon a time", "The little bird", "Tom and Sue played"]
        .iter()
        .map(|text| tokenizer.encode(text).unwrap())
        .collect();
    prompts.push(vec![1]);
    prompts
}

fn params(
    max_tokens: usize,
    temperature: f32,
    seed: u64,
) -> (plain::GenerateParams, drafted::GenerateParams) {
    (
        plain::GenerateParams { max_tokens, temperature, top_k: 0, top_p: 1.0, seed },
        drafted::GenerateParams { max_tokens, temperature, top_k: 0, top_p: 1.0, seed },
    )
}

/// Checks that `got` (speculating) equals `expected` (plain decoding after `context`), or
/// departs from it only at a greedy tie of the plain model's logits; true where they are equal.
fn same_or_tie(model: &plain::Model, context: &[u32], expected: &[u32], got: &[u32], what: &str) -> bool {
    let Some(at) = expected.iter().zip(got).position(|(a, b)| a != b) else {
        assert_eq!(expected.len(), got.len(), "{what}");
        return true;
    };
    let mut session = model.session();
    let context: Vec<u32> = context.iter().chain(&expected[..at]).copied().collect();
    let logits = session.prefill(&context).unwrap();
    let (a, b) = (logits[expected[at] as usize], logits[got[at] as usize]);
    assert!(
        (a - b).abs() < TIE,
        "{what}: departs at {at} ({} against {}), not at a tie ({a} against {b})",
        expected[at],
        got[at]
    );
    false
}

#[test]
fn greedy_drafts_of_the_draft_model_give_the_tokens_of_plain_decoding() {
    let Some(dir) = model_dir("stories260k") else { return };
    let (plain_model, model) = (plain::Model::load(&dir).unwrap(), drafted::Model::load(&dir).unwrap());
    let tokenizer = plain::Tokenizer::load_with_encoder(&dir).unwrap();
    let (mut drafts, mut kept) = (0, 0);
    for prompt in prompts(&tokenizer) {
        for max_tokens in [0, 1, 2, 3, 5, 17, 120, 400] {
            let (want_params, got_params) = params(max_tokens, 0.0, 0);
            let mut want_session = plain_model.session();
            let want = want_session.generate(&prompt, &want_params, |_| true).unwrap();
            let mut got_session = model.session();
            let mut streamed = Vec::new();
            let got = got_session
                .generate(&prompt, &got_params, |id| {
                    streamed.push(id);
                    true
                })
                .unwrap();
            let what = format!("prompt {prompt:?}, max_tokens {max_tokens}");
            if same_or_tie(&plain_model, &prompt, &want.generated_ids, &got.generated_ids, &what) {
                assert_eq!(want.stop.as_str(), got.stop.as_str(), "{what}");
                assert_eq!(want_session.position(), got_session.position(), "{what}");
            }
            assert_eq!(streamed, got.generated_ids, "{what}: on_token sees every token, in order");
            assert!(got.accepted <= got.drafted, "{what}");
            drafts += got.drafted;
            kept += got.accepted;
        }
    }
    // The int4 copy picks what the f32 model picks most of the time (69% of 105 drafts after
    // "Once upon a time", 100 tokens, when measured).
    assert!(kept * 2 > drafts, "{kept} of {drafts} drafts kept");
}

#[test]
fn sampled_and_multi_turn_generations_equal_plain_decodings() {
    let Some(dir) = model_dir("stories260k") else { return };
    let (plain_model, model) = (plain::Model::load(&dir).unwrap(), drafted::Model::load(&dir).unwrap());
    let tokenizer = plain::Tokenizer::load_with_encoder(&dir).unwrap();
    let prompts = prompts(&tokenizer);
    // Each sampled pick of a verification's rows takes the coin plain decoding's step would:
    // the output is the target model's, whatever the draft model proposed.
    for seed in 0..12 {
        let prompt = &prompts[seed as usize % prompts.len()];
        let (want_params, got_params) = params(60, 1.0, seed);
        let want = plain_model.session().generate(prompt, &want_params, |_| true).unwrap();
        let got = model.session().generate(prompt, &got_params, |_| true).unwrap();
        same_or_tie(&plain_model, prompt, &want.generated_ids, &got.generated_ids, &format!("seed {seed}"));
    }
    // Turns of one session: the draft model's session follows the target's through what each
    // turn keeps (it rewinds to what it shares with the sequence, then runs the rest).
    let (mut want_session, mut got_session) = (plain_model.session(), model.session());
    let mut context = Vec::new();
    for (turn, prompt) in prompts.iter().enumerate() {
        let (want_params, got_params) = params(40, 0.0, 0);
        let want = want_session.generate(prompt, &want_params, |_| true).unwrap();
        let got = got_session.generate(prompt, &got_params, |_| true).unwrap();
        context.extend_from_slice(prompt);
        let what = format!("turn {turn}");
        if !same_or_tie(&plain_model, &context, &want.generated_ids, &got.generated_ids, &what) {
            return;
        }
        assert_eq!(want_session.position(), got_session.position(), "{what}");
        context.extend_from_slice(&want.generated_ids[..want.generated_ids.len().saturating_sub(1)]);
    }
}

/// A model directory holding `dir`'s files, and `draft/` holding `draft`'s where given.
fn model_with_draft(dir: &Path, draft: Option<&Path>, without_tokenizer: bool) -> tempfile::TempDir {
    let temp = tempfile::tempdir().unwrap();
    for file in ["model.safetensors", "tokenizer.json", "config.json"] {
        std::os::unix::fs::symlink(dir.join(file), temp.path().join(file)).unwrap();
    }
    if let Some(draft) = draft {
        std::fs::create_dir(temp.path().join("draft")).unwrap();
        for file in ["model.safetensors", "tokenizer.json", "config.json"] {
            if file == "tokenizer.json" && without_tokenizer {
                continue;
            }
            std::os::unix::fs::symlink(draft.join(file), temp.path().join("draft").join(file)).unwrap();
        }
    }
    temp
}

#[test]
fn a_draft_model_of_its_own_needs_the_targets_tokenizer() {
    let (Some(dir), Some(other)) = (model_dir("stories260k"), model_dir("aidreams260k")) else { return };
    // aidreams260k has stories260k's shapes, vocabulary size and special ids, but its own
    // tokenizer: its ids mean other text.
    let mixed = model_with_draft(&dir, Some(&other), false);
    let e = drafted::Model::load(mixed.path()).err().expect("another tokenizer is refused").to_string();
    assert!(e.contains("draft/tokenizer.json") && e.contains("differs from the target's"), "{e}");
    let e = drafted::Model::load(model_with_draft(&dir, Some(&dir), true).path())
        .err()
        .expect("none")
        .to_string();
    assert!(e.contains("the draft model has none"), "{e}");
    // A draft directory with the target's tokenizer is read (here, the same checkpoint), and
    // generation is what it is without one.
    let own = model_with_draft(&dir, Some(&dir), false);
    let model = drafted::Model::load(own.path()).unwrap();
    let (_, p) = params(50, 0.0, 0);
    let from_own = model.session().generate(&[1, 403, 407], &p, |_| true).unwrap();
    let from_dir =
        drafted::Model::load(&dir).unwrap().session().generate(&[1, 403, 407], &p, |_| true).unwrap();
    assert_eq!(from_own.generated_ids, from_dir.generated_ids);
    assert_eq!((from_own.drafted, from_own.accepted), (from_dir.drafted, from_dir.accepted));
}

#[test]
fn the_draft_model_is_a_crate_of_its_own_in_the_targets() {
    let krate = workspace_root().join("generated/stories260k-cpu-f32-draft-int4");
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(
            "draft_model = { package = \"stories260k-cpu-f32-draft-int4-draft\", path = \"draft\", default-features = false }"
        ),
        "{manifest}"
    );
    let draft_manifest = std::fs::read_to_string(krate.join("draft/Cargo.toml")).unwrap();
    // A member of the target's workspace, whose profiles apply.
    assert!(
        !draft_manifest.contains("[workspace]") && !draft_manifest.contains("[profile"),
        "{draft_manifest}"
    );
    let draft_lock = std::fs::read_to_string(krate.join("draft/monogen.lock")).unwrap();
    assert!(draft_lock.contains("implementation = \"q4-"), "{draft_lock}");
    // No prompt lookup: neither its kernel nor its constants.
    assert!(!krate.join("src/kernels/speculator.rs").exists());
    let lib = std::fs::read_to_string(krate.join("src/lib.rs")).unwrap();
    assert!(lib.contains("pub const DRAFT_TOKENS: usize = 4;") && !lib.contains("LOOKUP_MAX"), "{lib}");
    // The draft crate rewinds (the drafter needs it) and speculates itself no further.
    let draft_model = std::fs::read_to_string(krate.join("draft/src/model.rs")).unwrap();
    assert!(draft_model.contains("pub fn rewind(") && !draft_model.contains("fn verify("));
    // A crate speculating by prompt lookup has no drafter.
    assert!(!workspace_root().join("generated/stories260k-cpu-f32-lookup/src/drafter.rs").exists());
}

/// Requests of several lengths handed to a served crate's engine at once: sequences of one step
/// draft with the draft model's sessions of their places, verify beside each other, and give
/// the tokens plain decoding gives each alone.
#[test]
fn a_server_drafts_for_each_sequence_of_a_batch_with_the_tokens_each_gives_alone() {
    let Some(dir) = model_dir("stories260k") else { return };
    let plain_model = plain::Model::load(&dir).unwrap();
    let tokenizer = plain::Tokenizer::load_with_encoder(&dir).unwrap();
    let model = Arc::new(served::Model::load(&dir).unwrap());
    let engine = served::engine::Engine::start(model.clone(), Default::default());
    let mut requests = Vec::new();
    for (i, prompt) in prompts(&tokenizer).into_iter().cycle().take(7).enumerate() {
        submit(&engine, &mut requests, prompt, [40, 120, 7, 80, 1, 60, 100][i], 1);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while requests.iter().any(|r| !r.done) {
        poll(&mut requests, deadline);
    }
    assert_each_as_alone(&plain_model, &requests);
    // The served crate's own `Session` (one place of a batch) drafts with the draft model too,
    // and keeps most of its drafts.
    let params = served::GenerateParams { max_tokens: 100, temperature: 0.0, ..Default::default() };
    let prompt = &requests[0].prompt;
    let alone = model.session().generate(prompt, &params, |_| true).unwrap();
    let (want_params, _) = self::params(100, 0.0, 0);
    let want = plain_model.session().generate(prompt, &want_params, |_| true).unwrap();
    same_or_tie(&plain_model, prompt, &want.generated_ids, &alone.generated_ids, "a session");
    assert!(
        alone.accepted * 2 > alone.drafted && alone.drafted > 0,
        "{} of {} kept",
        alone.accepted,
        alone.drafted
    );
}

/// A sequence keeps its draft model session when more urgent requests take the first places of
/// the step: two batch-class requests with long prompts decode, then two interactive ones arrive
/// and run ahead of them. Were the sessions kept per place, each of the two would run its whole
/// context again in the draft model; the positions the draft model ran stay within each
/// request's tokens once plus its drafts, and every request gets its tokens alone.
#[test]
fn a_sequence_keeps_its_draft_session_when_a_more_urgent_one_takes_its_place() {
    let (Some(dir), Some(plain_dir)) = (model_dir("stories260k"), model_dir("stories260k")) else { return };
    let model = Arc::new(served::Model::load(&dir).unwrap());
    let plain_model = plain::Model::load(&plain_dir).unwrap();
    let tokenizer = plain::Tokenizer::load_with_encoder(&plain_dir).unwrap();
    let story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the \
                 park with her friends. One day, she saw a big red ball under a tree. She ran to get it, but \
                 a small dog took it first. Lily was sad, but then the dog brought the ball back to her.";
    let long = tokenizer.encode(&format!("{story} {story} And they played")).unwrap();
    assert!(long.len() > 150, "{} tokens", long.len());
    let metrics: Arc<served::metrics::Metrics> = Default::default();
    let engine = served::engine::Engine::start(model.clone(), metrics.clone());
    let mut requests: Vec<Served> = Vec::new();
    let batch_class = served::PRIORITIES.iter().position(|&p| p == "batch").unwrap() as u8;
    let long_too: Vec<u32> = long.iter().copied().take(long.len() - 9).collect();
    submit(&engine, &mut requests, long.clone(), 80, batch_class);
    submit(&engine, &mut requests, long_too, 80, batch_class);
    let deadline = Instant::now() + Duration::from_secs(120);
    while requests.iter().any(|r| r.tokens.len() < 10 && !r.done) {
        poll(&mut requests, deadline);
    }
    assert!(requests.iter().all(|r| !r.done), "both still decode when the urgent ones arrive");
    for prompt in prompts(&tokenizer).into_iter().take(2) {
        submit(&engine, &mut requests, prompt, 40, 0);
    }
    while requests.iter().any(|r| !r.done) {
        poll(&mut requests, deadline);
    }
    assert_each_as_alone(&plain_model, &requests);
    let ran = metrics.draft_positions.load(std::sync::atomic::Ordering::Relaxed);
    let drafted = metrics.drafted_tokens.load(std::sync::atomic::Ordering::Relaxed);
    let tokens: usize = requests.iter().map(|r| r.prompt.len() + r.tokens.len()).sum();
    let once = tokens as u64 + drafted;
    eprintln!("the draft model ran {ran} positions; the requests' tokens once and the drafts: {once}");
    assert!(drafted > 0 && ran <= once, "the draft model ran {ran} positions, more than {once}");
}

/// A request handed to an engine, and what it has answered so far.
struct Served {
    prompt: Vec<u32>,
    max_tokens: usize,
    receiver: tokio::sync::mpsc::UnboundedReceiver<served::engine::Event>,
    tokens: Vec<u32>,
    done: bool,
}

fn submit(
    engine: &served::engine::Engine,
    requests: &mut Vec<Served>,
    prompt: Vec<u32>,
    max_tokens: usize,
    priority: u8,
) {
    let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
    let params = served::GenerateParams { max_tokens, temperature: 0.0, ..Default::default() };
    engine.submit(served::engine::Request { prompt: prompt.clone(), params, priority, events }).unwrap();
    requests.push(Served { prompt, max_tokens, receiver, tokens: Vec::new(), done: false });
}

/// Takes the events that have arrived; fails past `deadline`.
fn poll(requests: &mut [Served], deadline: Instant) {
    assert!(Instant::now() < deadline, "the engine did not finish in time");
    for r in requests.iter_mut().filter(|r| !r.done) {
        while let Ok(event) = r.receiver.try_recv() {
            match event {
                served::engine::Event::Token(t) => r.tokens.push(t),
                served::engine::Event::Done(_) => r.done = true,
                served::engine::Event::Failed(e) => panic!("a request failed: {e}"),
            }
        }
    }
    std::thread::sleep(Duration::from_millis(1));
}

/// Each request's greedy tokens are those of its prompt decoded alone by plain decoding, or depart
/// from them only at a tie.
fn assert_each_as_alone(plain_model: &plain::Model, requests: &[Served]) {
    for (i, r) in requests.iter().enumerate() {
        let (params, _) = params(r.max_tokens, 0.0, 0);
        let want = plain_model.session().generate(&r.prompt, &params, |_| true).unwrap();
        same_or_tie(plain_model, &r.prompt, &want.generated_ids, &r.tokens, &format!("request {i}"));
    }
}
