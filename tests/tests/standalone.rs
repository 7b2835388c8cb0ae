//! A committed crate copied out of the repository builds on its own (no path or git
//! dependencies, its own empty workspace), and its binary does what its README says.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use monogen_tests::{build_copy, ids, model_dir, reference_json};
use serde_json::Value;

const CRATE: &str = "stories260k-cpu-f32";

/// The binary of a copy of the crate, built once.
fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| build_copy(CRATE))
}

fn run(args: &[&str]) -> Output {
    Command::new(binary()).args(args).output().expect("the binary runs")
}

fn json(output: &Output) -> Value {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("one JSON object on stdout")
}

#[test]
fn json_output_matches_the_reference_greedy_continuation() {
    let Some(model) = model_dir("stories260k") else { return };
    let reference = reference_json(&model);
    let case = &reference["greedy"][0];
    let m = model.to_str().unwrap();
    let out = json(&run(&[
        "--model",
        m,
        "--prompt",
        case["prompt"].as_str().unwrap(),
        "--max-tokens",
        "32",
        "--json",
    ]));
    assert_eq!(ids(&out["prompt_ids"]), ids(&case["prompt_ids"]));
    assert_eq!(ids(&out["generated_ids"]), ids(&case["new_ids"]));
    assert_eq!(out["text"], case["new_text"]);
    for key in ["load_ms", "prefill_ms", "prefill_tok_s", "decode_tok_s"] {
        assert!(out[key].as_f64().is_some_and(|v| v >= 0.0), "{key}: {}", out[key]);
    }

    let prompt_ids: Vec<String> = ids(&case["prompt_ids"]).iter().map(u32::to_string).collect();
    let by_ids =
        json(&run(&["--model", m, "--prompt-ids", &prompt_ids.join(","), "--max-tokens", "32", "--json"]));
    assert_eq!(by_ids["generated_ids"], out["generated_ids"]);
    // Ids are used exactly as given: without BOS the continuation differs.
    let no_bos = json(&run(&[
        "--model",
        m,
        "--prompt-ids",
        &prompt_ids[1..].join(","),
        "--max-tokens",
        "8",
        "--json",
    ]));
    assert_eq!(ids(&no_bos["prompt_ids"]).len(), prompt_ids.len() - 1);
}

#[test]
fn streamed_text_is_the_prompt_and_its_continuation() {
    let Some(model) = model_dir("stories260k") else { return };
    let m = model.to_str().unwrap();
    let streamed = run(&["--model", m, "--prompt", "Zoo", "--max-tokens", "32"]);
    assert!(streamed.status.success());
    let text = String::from_utf8(streamed.stdout).unwrap();
    let expected = reference_json(&model)["greedy"][1]["text"].as_str().unwrap().to_string();
    assert_eq!(text, format!("{expected}\n"));
    let stats = String::from_utf8(streamed.stderr).unwrap();
    assert!(stats.contains("decode") && stats.contains("tok/s"), "{stats}");
}

#[test]
fn seeds_make_sampling_reproducible() {
    let Some(model) = model_dir("stories260k") else { return };
    let m = model.to_str().unwrap();
    let sample = |seed: &str| {
        json(&run(&[
            "--model",
            m,
            "--prompt",
            "Once upon a time",
            "--max-tokens",
            "40",
            "--temperature",
            "1.0",
            "--top-p",
            "0.95",
            "--seed",
            seed,
            "--json",
        ]))["generated_ids"]
            .clone()
    };
    assert_eq!(sample("11"), sample("11"));
    assert!(
        (12..16).any(|s| sample(&s.to_string()) != sample("11")),
        "different seeds should give different text"
    );
}

#[test]
fn bad_requests_fail_with_a_message_and_an_exit_code() {
    let Some(model) = model_dir("stories260k") else { return };
    let m = model.to_str().unwrap();
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--model", "/nonexistent/model", "--prompt", "x"], 3, "cannot read /nonexistent/model"),
        (&["--model", m], 2, "--prompt"),
        (&["--model", m, "--prompt", ""], 2, "the prompt is empty"),
        (&["--model", m, "--prompt-ids", "1,99999"], 2, "token id 99999 is outside the vocabulary"),
        (&["--model", m, "--prompt", "x", "--temperature", "-1"], 2, "invalid temperature"),
        (&["--model", m, "--prompt", "x", "--top-p", "0"], 2, "invalid top_p"),
        (&["--model", m, "--prompt", "x", "--max-tokens", "lots"], 2, "invalid value 'lots'"),
    ];
    for (args, code, message) in cases {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: expected {message:?} in {stderr}");
    }
    let long_prompt = "Once upon a time ".repeat(200);
    let out = run(&["--model", m, "--prompt", &long_prompt]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("more than the 512 positions"), "{out:?}");
    assert!(out.stdout.is_empty(), "nothing is printed for a prompt that is refused");
}

#[test]
fn a_closed_pipe_ends_output_quietly() {
    let Some(model) = model_dir("stories260k") else { return };
    let mut child = Command::new(binary())
        .args(["--model", model.to_str().unwrap(), "--prompt", "Once upon a time", "--max-tokens", "200"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_library_user_does_not_build_the_command_line() {
    // Building the copy resolved its dependencies; `cargo tree` then needs no network.
    binary();
    let manifest =
        monogen_tests::workspace_root().join("target/generated-copies").join(CRATE).join("Cargo.toml");
    let tree = |extra: &[&str]| {
        let out = Command::new(env!("CARGO"))
            .args(["tree", "--offline", "-e", "normal", "--prefix", "none", "--manifest-path"])
            .arg(&manifest)
            .args(extra)
            .output()
            .expect("cargo runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let has_clap = |tree: &str| tree.lines().any(|l| l.starts_with("clap "));
    assert!(has_clap(&tree(&[])), "the binary's default feature brings clap");
    let library = tree(&["--no-default-features"]);
    assert!(!has_clap(&library), "a library user builds clap:\n{library}");
    assert!(library.lines().any(|l| l.starts_with("tokenizers ")), "{library}");
}
