//! The prefix cache of a `Session` (`request.shared_prefix_len` without a server):
//! `generate_anew` keeps the positions the session holds that a new prompt starts with, and its
//! tokens are those of the prompt run in a fresh session. Tested on the real model with
//! `stories260k-cpu-f32-lookup` (unbatched) and the chat twin's batched `Session`.

use monogen_tests::model_dir;
use stories260k_chat_cpu_f32 as chatty;
use stories260k_cpu_f32 as plain;
use stories260k_cpu_f32_lookup as lookup;

const SYSTEM: &str = "Once upon a time, there was a little girl named Lily. She loved to play outside with her \
    friends in the big park.";

/// Prompts that share SYSTEM's tokens at their start, then differ.
fn prompts(tokenizer: &plain::Tokenizer) -> Vec<Vec<u32>> {
    let system = tokenizer.encode(SYSTEM).unwrap();
    ["One day, she saw a dog.", "Her mom said", "They went to the park and", "The sun was hot."]
        .iter()
        .map(|tail| {
            let mut ids = system.clone();
            ids.extend(&tokenizer.encode(tail).unwrap()[1..]);
            ids
        })
        .collect()
}

fn fresh(model: &plain::Model, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let params = plain::GenerateParams { max_tokens, ..Default::default() };
    model.session().generate(prompt, &params, |_| true).unwrap().generated_ids
}

#[test]
fn generate_anew_keeps_the_shared_start_and_gives_the_tokens_of_a_fresh_session() {
    let Some(dir) = model_dir("stories260k") else { return };
    let tokenizer = plain::Tokenizer::load_with_encoder(&dir).unwrap();
    let reference = plain::Model::load(&dir).unwrap();
    let model = lookup::Model::load(&dir).unwrap();
    let prompts = prompts(&tokenizer);
    let system = tokenizer.encode(SYSTEM).unwrap().len();
    assert!(system >= 2 * lookup::PREFIX_CACHE_MIN, "{system}");
    let params = lookup::GenerateParams { max_tokens: 30, ..Default::default() };

    let mut session = model.session();
    for (i, prompt) in prompts.iter().enumerate() {
        let g = session.generate_anew(prompt, &params, |_| true).unwrap();
        // The first reads everything; each later one keeps at least the shared start (more
        // where its tail begins as the previous one's did).
        if i == 0 {
            assert_eq!(g.reused, 0);
        } else {
            assert!(g.reused >= system && g.reused < prompt.len(), "prompt {i}: {} kept", g.reused);
        }
        assert_eq!(g.prompt_ids, prompt[g.reused..], "prompt {i}");
        assert_eq!(g.generated_ids, fresh(&reference, prompt, 30), "prompt {i}");
        // Prompt lookup reads the kept start too: it drafts as a fresh session given the
        // whole prompt does.
        let whole = model.session().generate(prompt, &params, |_| true).unwrap();
        assert_eq!((g.drafted, g.accepted), (whole.drafted, whole.accepted), "prompt {i}");
        assert_eq!(session.held().len(), session.position());
        assert_eq!(session.held()[..prompt.len()], prompt[..], "prompt {i}");
    }
    // The same prompt again: all of it but its last token is kept.
    let last = &prompts[3];
    let g = session.generate_anew(last, &params, |_| true).unwrap();
    assert_eq!(g.reused, last.len() - 1);
    assert_eq!(g.generated_ids, fresh(&reference, last, 30));

    // A prompt that shares less than PREFIX_CACHE_MIN tokens starts afresh.
    let other = tokenizer.encode("Once upon a time, a cat sat on the mat.").unwrap();
    let shared = session.held().iter().zip(&other).take_while(|(a, b)| a == b).count();
    assert!(shared > 1 && shared < lookup::PREFIX_CACHE_MIN, "{shared}");
    let g = session.generate_anew(&other, &params, |_| true).unwrap();
    assert_eq!(g.reused, 0);
    assert_eq!(g.generated_ids, fresh(&reference, &other, 30));

    // Refused before the session forgets anything: it still holds what it held.
    let held = session.held().to_vec();
    let mut bad = prompts[0].clone();
    bad.push(lookup::VOCAB_SIZE as u32);
    assert!(session.generate_anew(&bad, &params, |_| true).is_err());
    let too_long = vec![5; lookup::MAX_SEQ_LEN + 1];
    assert!(session.generate_anew(&too_long, &params, |_| true).is_err());
    let bad_params = lookup::GenerateParams { top_p: 0.0, ..params.clone() };
    assert!(session.generate_anew(&prompts[0], &bad_params, |_| true).is_err());
    assert!(session.generate_anew(&[], &params, |_| true).is_err());
    assert_eq!(session.held(), held);
    assert_eq!(session.position(), held.len());

    // rewind and reset keep `held` in step with the positions.
    session.rewind(10);
    assert_eq!(session.held(), &held[..10]);
    session.reset();
    assert!(session.held().is_empty());
}

#[test]
fn a_batched_session_keeps_its_shared_start_too() {
    let Some(dir) = model_dir("stories260k") else { return };
    let tokenizer = plain::Tokenizer::load_with_encoder(&dir).unwrap();
    let reference = plain::Model::load(&dir).unwrap();
    let model = chatty::Model::load(&dir).unwrap();
    let params = chatty::GenerateParams { max_tokens: 25, ..Default::default() };
    let mut session = model.session();
    for (i, prompt) in prompts(&tokenizer).iter().enumerate() {
        let g = session.generate_anew(prompt, &params, |_| true).unwrap();
        assert_eq!(g.reused > 0, i > 0, "prompt {i}: {} kept", g.reused);
        assert_eq!(g.generated_ids, fresh(&reference, prompt, 25), "prompt {i}");
        assert_eq!(session.held().len(), session.position());
    }
}

/// A crate without `shared_prefix_len` has no prefix cache in its session.
#[test]
fn a_crate_without_shared_prefix_len_has_no_generate_anew() {
    let root = monogen_tests::workspace_root().join("generated");
    for file in ["generate.rs", "model.rs"] {
        let text = std::fs::read_to_string(root.join("stories260k-cpu-f32/src").join(file)).unwrap();
        assert!(
            !text.contains("generate_anew") && !text.contains("held") && !text.contains("PREFIX_CACHE_MIN"),
            "{file}"
        );
    }
}
