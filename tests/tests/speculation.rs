//! Speculative decoding by prompt lookup (`stories260k-cpu-f32-lookup`, the workload of
//! `stories260k-cpu-f32` with a `[speculation]` table) against plain decoding
//! (`stories260k-cpu-f32`) on the real model: the same tokens, greedy and sampled, the same stop
//! and the same session afterwards; drafted tokens kept where the text repeats itself; and the
//! sampled picks of verification rows distributed as the model says.

use monogen_tests::model_dir;
use stories260k_cpu_f32 as plain;
use stories260k_cpu_f32_lookup as lookup;

/// Logits closer than this are a tie: a verification's rows and a decode step's row sum in
/// different orders, so a tie may break either way.
const TIE: f32 = 1e-4;

struct Models {
    plain: plain::Model,
    lookup: lookup::Model,
    tokenizer: plain::Tokenizer,
}

fn models() -> Option<Models> {
    let dir = model_dir("stories260k")?;
    Some(Models {
        plain: plain::Model::load(&dir).unwrap(),
        lookup: lookup::Model::load(&dir).unwrap(),
        tokenizer: plain::Tokenizer::load_with_encoder(&dir).unwrap(),
    })
}

/// Text that repeats itself, as a document being quoted does.
const REPEATING: &str = "Once upon a time, there was a little girl named Lily. She loved to play outside in the \
    park. One day, she saw a big, red ball. Once upon a time, there was a little girl named Lily. She loved";

fn prompts(m: &Models) -> Vec<Vec<u32>> {
    let mut prompts: Vec<Vec<u32>> = [REPEATING, "Once upon a time", "The little bird", "Tom and Sue played"]
        .iter()
        .map(|text| m.tokenizer.encode(text).unwrap())
        .collect();
    prompts.push(vec![1]);
    prompts
}

fn plain_params(
    max_tokens: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    seed: u64,
) -> plain::GenerateParams {
    plain::GenerateParams { max_tokens, temperature, top_k, top_p, seed }
}

fn lookup_params(p: &plain::GenerateParams) -> lookup::GenerateParams {
    lookup::GenerateParams {
        max_tokens: p.max_tokens,
        temperature: p.temperature,
        top_k: p.top_k,
        top_p: p.top_p,
        seed: p.seed,
    }
}

fn stop_name(stop: lookup::StopReason) -> &'static str {
    stop.as_str()
}

/// Checks that `got` (speculating) equals `expected` (plain decoding after `prompt`), or departs
/// from it only at a greedy tie of the plain model's logits.
fn assert_same_or_tie(m: &Models, prompt: &[u32], expected: &[u32], got: &[u32], what: &str) {
    let Some(at) = expected.iter().zip(got).position(|(a, b)| a != b) else {
        assert_eq!(expected.len(), got.len(), "{what}");
        return;
    };
    let mut session = m.plain.session();
    let context: Vec<u32> = prompt.iter().chain(&expected[..at]).copied().collect();
    let logits = session.prefill(&context).unwrap();
    let (a, b) = (logits[expected[at] as usize], logits[got[at] as usize]);
    assert!(
        (a - b).abs() < TIE,
        "{what}: departs at {at} ({} against {}), not at a tie ({a} against {b})",
        expected[at],
        got[at]
    );
}

#[test]
fn greedy_speculation_picks_the_tokens_of_plain_decoding() {
    let Some(m) = models() else { return };
    let mut kept = 0;
    for prompt in prompts(&m) {
        for max_tokens in [0, 1, 2, 3, 5, 17, 120, 400] {
            let params = plain_params(max_tokens, 0.0, 0, 1.0, 0);
            let mut want_session = m.plain.session();
            let want = want_session.generate(&prompt, &params, |_| true).unwrap();
            let mut got_session = m.lookup.session();
            let mut streamed = Vec::new();
            let got = got_session
                .generate(&prompt, &lookup_params(&params), |id| {
                    streamed.push(id);
                    true
                })
                .unwrap();
            let what = format!("prompt {prompt:?}, max_tokens {max_tokens}");
            assert_same_or_tie(&m, &prompt, &want.generated_ids, &got.generated_ids, &what);
            if want.generated_ids == got.generated_ids {
                assert_eq!(want.stop.as_str(), stop_name(got.stop), "{what}");
                // The session holds what plain decoding's holds: a drafted token that was not
                // handed out is forgotten.
                assert_eq!(want_session.position(), got_session.position(), "{what}");
            }
            assert_eq!(streamed, got.generated_ids, "{what}: on_token sees every token, in order");
            assert!(got.accepted <= got.drafted, "{what}");
            assert_eq!(got.decode_steps, got.generated_ids.len().saturating_sub(1), "{what}");
            kept += got.accepted;
        }
    }
    assert!(kept > 0, "drafted tokens were kept somewhere");
}

#[test]
fn repeating_text_keeps_drafted_tokens() {
    let Some(m) = models() else { return };
    let prompt = m.tokenizer.encode(REPEATING).unwrap();
    let params = lookup_params(&plain_params(60, 0.0, 0, 1.0, 0));
    let got = m.lookup.session().generate(&prompt, &params, |_| true).unwrap();
    // The prompt's second copy of the story is under way: the model goes on quoting it.
    assert!(got.drafted >= 20 && got.accepted >= 5, "{} drafted, {} kept", got.drafted, got.accepted);
}

#[test]
fn sampling_with_a_seed_picks_the_tokens_of_plain_decoding() {
    let Some(m) = models() else { return };
    let prompts = prompts(&m);
    let mut kept = 0;
    for seed in 0..40 {
        let prompt = &prompts[seed as usize % prompts.len()];
        let (temperature, top_k, top_p) = [(1.0, 0, 1.0), (0.8, 40, 0.9), (0.5, 0, 0.95)][seed as usize % 3];
        let params = plain_params(80, temperature, top_k, top_p, seed);
        let want = m.plain.session().generate(prompt, &params, |_| true).unwrap();
        let got = m.lookup.session().generate(prompt, &lookup_params(&params), |_| true).unwrap();
        // One coin per picked token, in the same order: a sampled pick departs only where a coin
        // falls within the rounding of a cumulative probability, which these seeds do not.
        assert_eq!(want.generated_ids, got.generated_ids, "seed {seed}");
        kept += got.accepted;
    }
    assert!(kept > 0, "drafted tokens were kept somewhere");
}

/// The first pick of a verification (the token after `prefix`'s last, drafted behind it) and the
/// pick after a kept drafted token, sampled at temperature 1 over many seeds, against the
/// probabilities of plain decoding's logits.
#[test]
fn sampled_picks_of_verifications_follow_the_models_distribution() {
    let Some(m) = models() else { return };
    let prompt = m.tokenizer.encode(REPEATING).unwrap();
    let runs = 3000;
    let mut samples: Vec<Vec<u32>> = Vec::with_capacity(runs);
    let mut drafted_at_first_step = 0;
    for seed in 0..runs as u64 {
        let params = lookup_params(&plain_params(4, 1.0, 0, 1.0, 1000 + seed));
        let g = m.lookup.session().generate(&prompt, &params, |_| true).unwrap();
        drafted_at_first_step += usize::from(g.drafted > 0);
        samples.push(g.generated_ids);
    }
    assert!(
        drafted_at_first_step * 4 >= runs * 3,
        "prompt lookup drafts at the first step: {drafted_at_first_step}"
    );
    // Condition on the most common first token (picked by prefill), then on the most common
    // second token: the second and third picks come from verification rows.
    for depth in 1..=2 {
        let mut counts = std::collections::BTreeMap::<Vec<u32>, usize>::new();
        for s in &samples {
            *counts.entry(s[..depth].to_vec()).or_default() += 1;
        }
        let (prefix, n) = counts.into_iter().max_by_key(|&(_, n)| n).unwrap();
        assert!(n >= 500, "depth {depth}: {n} samples share the most common prefix {prefix:?}");
        let context: Vec<u32> = prompt.iter().chain(&prefix).copied().collect();
        let logits = m.plain.session().prefill(&context).unwrap().to_vec();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
        let p = |id: usize| f64::from((logits[id] - max).exp()) / total;
        let mut seen = vec![0usize; logits.len()];
        for s in samples.iter().filter(|s| s[..depth] == prefix[..]) {
            seen[s[depth] as usize] += 1;
        }
        // Every token of probability above 2%: its share within 4.5 standard deviations.
        let mut checked = 0;
        for id in (0..logits.len()).filter(|&id| p(id) > 0.02) {
            let share = seen[id] as f64 / n as f64;
            let sigma = (p(id) * (1.0 - p(id)) / n as f64).sqrt();
            assert!(
                (share - p(id)).abs() < 4.5 * sigma,
                "depth {depth}, after {prefix:?}: token {id} sampled {share:.4} of {n}, the model gives {:.4}",
                p(id)
            );
            checked += 1;
        }
        assert!(checked >= 2, "depth {depth}: {checked} tokens above 2%");
        // And nothing the model gives (almost) no chance.
        let impossible: usize = (0..logits.len()).filter(|&id| p(id) < 1e-6).map(|id| seen[id]).sum();
        assert_eq!(impossible, 0, "depth {depth}");
    }
}

#[test]
fn a_full_context_and_a_second_turn_stop_and_go_on_as_plain_decoding_does() {
    let Some(m) = models() else { return };
    let story = m.tokenizer.encode(REPEATING).unwrap();
    // A prompt that leaves 7 positions: the drafts must shrink to fit the cache.
    let mut long: Vec<u32> = Vec::new();
    while long.len() < lookup::MAX_SEQ_LEN - 7 {
        long.extend_from_slice(&story[1..]);
    }
    long.truncate(lookup::MAX_SEQ_LEN - 7);
    let params = plain_params(50, 0.0, 0, 1.0, 0);
    let want = m.plain.session().generate(&long, &params, |_| true).unwrap();
    let got = m.lookup.session().generate(&long, &lookup_params(&params), |_| true).unwrap();
    assert_eq!(want.generated_ids, got.generated_ids);
    assert_eq!(want.stop.as_str(), "context_full");
    assert_eq!(got.stop, lookup::StopReason::ContextFull);
    assert_eq!(got.generated_ids.len(), 8, "7 positions run, and the last pick");

    // Two turns in one session, the second after what the first left.
    let (mut a, mut b) = (m.plain.session(), m.lookup.session());
    for (turn, prompt) in [&story[..], &story[1..20]].into_iter().enumerate() {
        let params = plain_params(40, 0.0, 0, 1.0, 0);
        let want = a.generate(prompt, &params, |_| true).unwrap();
        let got = b.generate(prompt, &lookup_params(&params), |_| true).unwrap();
        assert_eq!(want.generated_ids, got.generated_ids, "turn {turn}");
        assert_eq!(a.position(), b.position(), "turn {turn}");
    }

    // A callback that stops while a verification's picks are still ahead.
    let params = lookup_params(&plain_params(60, 0.0, 0, 1.0, 0));
    let mut session = m.lookup.session();
    let mut seen = 0;
    let got = session
        .generate(&story, &params, |_| {
            seen += 1;
            seen < 9
        })
        .unwrap();
    assert_eq!(got.stop, lookup::StopReason::Cancelled);
    assert_eq!(got.generated_ids.len(), 9);
    assert_eq!(session.position(), story.len() + 8);
}

#[test]
fn verify_runs_the_rows_of_a_step_and_rewind_forgets_them() {
    let Some(m) = models() else { return };
    let story = m.tokenizer.encode(REPEATING).unwrap();
    let (head, rows) = story.split_at(story.len() - (lookup::DRAFT_TOKENS + 1));
    let mut session = m.lookup.session();
    session.prefill(head).unwrap();
    let verified = session.verify(rows).unwrap().to_vec();
    assert_eq!(verified.len(), rows.len() * lookup::VOCAB_SIZE);
    let all = m.plain.session().logits_all(&story).unwrap();
    let want = &all[head.len() * plain::VOCAB_SIZE..];
    let diff = verified.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(diff < TIE, "a verification's logits are the model's: max abs diff {diff}");

    // Forget the last three rows and run them again one by one: the same logits.
    session.rewind(session.position() - 3);
    assert_eq!(session.position(), story.len() - 3);
    for (i, &id) in rows[rows.len() - 3..].iter().enumerate() {
        let logits = session.decode(id).unwrap();
        let row = rows.len() - 3 + i;
        let want = &verified[row * lookup::VOCAB_SIZE..(row + 1) * lookup::VOCAB_SIZE];
        let diff = logits.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(diff < TIE, "row {row}: max abs diff {diff}");
    }
    session.rewind(usize::MAX);
    assert_eq!(session.position(), story.len(), "rewinding forward changes nothing");

    let too_many = vec![5; lookup::DRAFT_TOKENS + 2];
    let e = session.verify(&too_many).unwrap_err().to_string();
    assert!(e.contains("at most DRAFT_TOKENS + 1"), "{e}");
    assert!(session.verify(&[]).is_err());
    assert!(session.verify(&[lookup::VOCAB_SIZE as u32]).is_err());
}

/// A crate generated without `[speculation]` has no speculation code: no speculator kernel, no
/// verification, no drafts; the speculating twin has them.
#[test]
fn a_crate_without_speculation_has_none_of_its_code() {
    let root = monogen_tests::workspace_root().join("generated");
    let sources = |name: &str| -> String {
        let mut files = Vec::new();
        let mut dirs = vec![root.join(name).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    files.push(std::fs::read_to_string(&path).unwrap());
                }
            }
        }
        files.concat()
    };
    let plain = sources("stories260k-cpu-f32");
    for word in ["speculat", "draft", "DRAFT_TOKENS", "LOOKUP_", "fn verify", "fn rewind", "VecDeque"] {
        assert!(!plain.contains(word), "stories260k-cpu-f32 mentions `{word}`");
    }
    let lookup = sources("stories260k-cpu-f32-lookup");
    for word in [
        "pub fn draft<",
        "pub fn verify",
        "pub fn rewind",
        "fn speculate",
        "pub const DRAFT_TOKENS: usize = 4;",
    ] {
        assert!(lookup.contains(word), "stories260k-cpu-f32-lookup lacks `{word}`");
    }
    assert!(root.join("stories260k-cpu-f32-lookup/src/kernels/speculator.rs").is_file());
}

/// A crate that batches (the chat twin, a server) verifies through its `Batch`: its
/// `Session::generate` speculates as the unbatched crate's does, with the same tokens.
#[test]
fn a_batched_crates_session_speculates_with_the_same_tokens() {
    use stories260k_chat_cpu_f32 as chatty;
    let Some(m) = models() else { return };
    let dir = model_dir("stories260k").unwrap();
    let batched = chatty::Model::load(&dir).unwrap();
    let mut kept = 0;
    for (n, prompt) in prompts(&m).iter().enumerate() {
        for (max_tokens, temperature) in [(1, 0.0), (40, 0.0), (150, 0.0), (60, 0.8)] {
            let params = plain_params(max_tokens, temperature, 0, 1.0, n as u64);
            let want = m.plain.session().generate(prompt, &params, |_| true).unwrap();
            let chatty_params =
                chatty::GenerateParams { max_tokens, temperature, top_k: 0, top_p: 1.0, seed: n as u64 };
            let mut session = batched.session();
            let got = session.generate(prompt, &chatty_params, |_| true).unwrap();
            let what = format!("prompt {n}, max_tokens {max_tokens}, temperature {temperature}");
            assert_same_or_tie(&m, prompt, &want.generated_ids, &got.generated_ids, &what);
            assert_eq!(
                session.position(),
                prompt.len() + got.generated_ids.len().saturating_sub(1),
                "{what}"
            );
            kept += got.accepted;
        }
    }
    assert!(kept > 0, "drafted tokens were kept somewhere");
}
