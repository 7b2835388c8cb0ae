//! What fuzzing found stays found: every input of the committed corpus (`fuzz/corpus/<target>/`)
//! and every regression input (`fuzz/regressions/<target>/`, where `fuzz/run.sh` copies each
//! crash it finds) runs here through the code its fuzz target calls (the workload parser; the
//! weight loaders of f32, int8, bf16, packing and BERT crates; the tokenizer.json readers; the
//! chat template renderer), as
//! an ordinary test, and must return (a value or an error) without a panic. The workload
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
