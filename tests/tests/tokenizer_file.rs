//! `templates/runtime/tokenizer_file.rs`, the tokenizer.json reader of every generated crate,
//! builds the tokenizer that `tokenizers::Tokenizer::from_file` builds (same serialized form,
//! same ids for the same text) and finds the largest id it can produce, and it refuses what
//! `from_file` refuses, but for the differences the reader documents. The decoding-only reader of
//! LLaMA crates (`templates/runtime/detokenizer.rs`) finds the same largest id, and decodes
//! every id, and sequences of them, one-shot and streamed, to the text `from_file`'s tokenizer
//! gives.

#[path = "../../templates/runtime/tokenizer_file.rs"]
mod tokenizer_file;

#[path = "../../templates/runtime/detokenizer.rs"]
mod detokenizer;

use std::path::{Path, PathBuf};

use monogen::workload::WorkloadSource;
use monogen_tests::{model_dir, workspace_root};
use serde_json::Value;
use tokenizers::Tokenizer;

const TEXTS: &[&str] = &[
    "Once upon a time, there was a little girl named Lily.",
    "  leading spaces, trailing spaces  ",
    "Ünïcödé, emoji 🦀 and 漢字",
    "<s> special </s> tokens <unk> in text",
    "",
];

/// Every tokenizer.json at hand: the real models', the test fixtures' and a synthetic one.
fn tokenizer_files(synthetic: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for name in ["stories260k", "aidreams260k", "all-minilm-l6-v2"] {
        if let Some(dir) = model_dir(name) {
            files.push(dir.join("tokenizer.json"));
        }
    }
    let fixtures = workspace_root().join("tests/fixtures");
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(fixtures)
        .unwrap()
        .map(|entry| entry.unwrap().path().join("tokenizer.json"))
        .filter(|file| file.is_file())
        .collect();
    fixtures.sort();
    files.extend(fixtures);
    let workload = WorkloadSource::read(&workspace_root().join("workloads/stories15m-bench-cpu-f32.toml"))
        .unwrap()
        .parse()
        .unwrap();
    monogen::synth::write_model_dir(&workload, synthetic, 3).unwrap();
    files.push(synthetic.join("tokenizer.json"));
    files
}

/// The reader and `from_file` agree on `text`: both build the same tokenizer (and the reader
/// the largest id), or, where `builds` is false, both refuse.
fn assert_same(what: &str, text: &str, builds: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, text).unwrap();
    match (tokenizer_file::parse(text), Tokenizer::from_file(&path)) {
        (Ok((ours, largest)), Ok(theirs)) if builds => {
            assert_eq!(ours.to_string(false).unwrap(), theirs.to_string(false).unwrap(), "{what}");
            // The largest id any token of the vocabulary or the added tokens has.
            assert_eq!(Some(largest), theirs.get_vocab(true).into_values().max(), "{what}");
            assert_decodes_alike(what, text, &theirs, largest);
            for sample in TEXTS {
                let (a, b) = (ours.encode(*sample, true).unwrap(), theirs.encode(*sample, true).unwrap());
                assert_eq!(a.get_ids(), b.get_ids(), "{what}: {sample:?}");
                assert_eq!(
                    ours.decode(a.get_ids(), true).unwrap(),
                    theirs.decode(b.get_ids(), true).unwrap(),
                    "{what}"
                );
            }
        }
        // What both refuse, the decoding-only reader refuses too: these files are broken in
        // what it reads as well.
        (Err(_), Err(_)) if !builds => {
            assert!(detokenizer::read(text).is_err(), "{what}: the decoding-only reader accepts it")
        }
        (ours, theirs) => panic!(
            "{what}: expected both to {}, but the reader gives {:?}, from_file {:?}",
            if builds { "build" } else { "refuse" },
            ours.map(|(_, largest)| format!("a tokenizer, largest id {largest}")).map_err(|e| e.to_string()),
            theirs.map(|_| "a tokenizer").map_err(|e| e.to_string()),
        ),
    }
}

/// The decoding-only reader of `text` finds the same largest id, and decodes every id (and
/// sequences of them, streamed too) to the text that `theirs` decodes it to.
fn assert_decodes_alike(what: &str, text: &str, theirs: &Tokenizer, largest: u32) {
    let (ours, our_largest) = detokenizer::read(text).unwrap();
    assert_eq!(our_largest, largest, "{what}: the largest id");
    // Every id, one at a time (those of the vocabulary and the added tokens, the ids below
    // 70000 between them, and two past the largest, which decode to nothing).
    let mut ids: std::collections::BTreeSet<u32> = theirs.get_vocab(true).into_values().collect();
    ids.extend(0..largest.saturating_add(3).min(70_000));
    ids.extend([largest.saturating_add(1), largest.saturating_add(2)]);
    for id in ids {
        for skip in [true, false] {
            assert_eq!(
                ours.decode(&[id], skip).unwrap(),
                theirs.decode(&[id], skip).unwrap(),
                "{what}: id {id}, skip_special_tokens {skip}"
            );
        }
    }
    // Sequences: the samples' ids, and runs of ids from across the vocabulary.
    let mut sequences: Vec<Vec<u32>> =
        TEXTS.iter().map(|t| theirs.encode(*t, true).unwrap().get_ids().to_vec()).collect();
    let n = largest + 1;
    sequences.extend((0..20u32).map(|s| (0..40u32).map(|i| (s * 7919 + i * 104_729) % n).collect()));
    sequences.push((0..n.min(300)).collect());
    for ids in &sequences {
        assert_eq!(ours.decode(ids, true).unwrap(), theirs.decode(ids, true).unwrap(), "{what}: {ids:?}");
        // Streamed, as `DecodeStream` streams them: the same pieces at the same steps.
        let mut stream = theirs.decode_stream(true);
        let mut our_stream = detokenizer::DecodeStream::default();
        for &id in ids {
            let theirs_step = stream.step(id).map_err(|e| e.to_string());
            let ours_step = our_stream.step(id, |ids| ours.decode(ids, true).map_err(|e| e.to_string()));
            assert_eq!(ours_step.is_ok(), theirs_step.is_ok(), "{what}: streaming {ids:?} at {id}");
            if let (Ok(a), Ok(b)) = (ours_step, theirs_step) {
                assert_eq!(a, b, "{what}: streaming {ids:?} at {id}");
            }
        }
    }
}

/// A tokenizer.json around `model`, with one added token.
fn with_model(model: Value) -> String {
    serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": model,
    })
    .to_string()
}

#[test]
fn builds_what_from_file_builds() {
    let synthetic = tempfile::tempdir().unwrap();
    let files = tokenizer_files(synthetic.path());
    assert!(files.len() >= 7, "{files:?}");
    let mut models = std::collections::BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let json: Value = serde_json::from_str(&text).unwrap();
        models.insert(json["model"]["type"].as_str().unwrap().to_string());
        assert_same(&file.display().to_string(), &text, true);
        // The decoding-only reader's own scan reads each of these vocabularies (and the test
        // above checks what it read): none needs `serde_json`'s slower reading.
        let model = tokenizer_file::File::read(&text).unwrap().model.get();
        assert!(detokenizer::Pieces::scan(model, &[]).is_some(), "{}", file.display());
    }
    // BPE (the LLaMA tokenizers), WordPiece (all-MiniLM), WordLevel (synthetic).
    assert!(models.len() >= 2, "{models:?}");
}

#[test]
fn variants_of_the_format_read_as_from_file_reads_them() {
    // A BPE tokenizer (byte-level, with merges and added tokens).
    let file = workspace_root().join("tests/fixtures/qwen2-tiny/tokenizer.json");
    let base: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let edit = |change: &dyn Fn(&mut Value)| {
        let mut json = base.clone();
        change(&mut json);
        json.to_string()
    };

    // An old file whose model has no `type`, and whose merges are "a b" strings.
    assert_same(
        "model without type",
        &edit(&|j| {
            j["model"].as_object_mut().unwrap().remove("type");
        }),
        true,
    );
    assert_same(
        "legacy merges",
        &edit(&|j| {
            let merges: Vec<Value> = j["model"]["merges"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| match m {
                    Value::Array(pair) => {
                        Value::String(format!("{} {}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap()))
                    }
                    other => other.clone(),
                })
                .collect();
            j["model"]["merges"] = Value::Array(merges);
        }),
        true,
    );
    // Fields left out, fields unknown, fields null.
    assert_same(
        "no added tokens",
        &edit(&|j| {
            j.as_object_mut().unwrap().remove("added_tokens");
        }),
        true,
    );
    assert_same(
        "no version",
        &edit(&|j| {
            j.as_object_mut().unwrap().remove("version");
        }),
        true,
    );
    // An unknown field: `from_file` stumbles on it (its deserializer reads the key and not the
    // value), the reader skips it.
    let dir = tempfile::tempdir().unwrap();
    let (plain, commented) = (dir.path().join("plain.json"), dir.path().join("commented.json"));
    std::fs::write(&plain, base.to_string()).unwrap();
    std::fs::write(&commented, edit(&|j| j["comment"] = Value::from("ignored"))).unwrap();
    assert_eq!(
        tokenizer_file::parse(&std::fs::read_to_string(&commented).unwrap())
            .unwrap()
            .0
            .to_string(false)
            .unwrap(),
        Tokenizer::from_file(&plain).unwrap().to_string(false).unwrap(),
    );
    assert_same("no decoder", &edit(&|j| j["decoder"] = Value::Null), true);
    // The same file written otherwise: pretty-printed, and with every character past ASCII
    // written as `\u` escapes (surrogate pairs past the first plane), as Python's `json` does.
    let pretty = serde_json::to_string_pretty(&base).unwrap();
    assert_same("pretty-printed", &pretty, true);
    let with_crab = edit(&|j| {
        j["model"]["vocab"].as_object_mut().unwrap().insert("▁🦀".to_string(), Value::from(512));
    });
    let ascii: String = with_crab
        .chars()
        .map(|c| match c.is_ascii() {
            true => c.to_string(),
            false => c.encode_utf16(&mut [0; 2]).iter().map(|unit| format!("\\u{unit:04x}")).collect(),
        })
        .collect();
    assert!(ascii.is_ascii() && ascii.contains("\\u2581\\ud83e\\udd80"), "pieces past ASCII");
    assert_same("escaped past ASCII", &ascii, true);
    for text in [&pretty, &ascii] {
        let model = tokenizer_file::File::read(text).unwrap().model.get();
        assert!(detokenizer::Pieces::scan(model, &[]).is_some());
    }
    // Forms the scan leaves to `serde_json`: a key written with escapes, which it then reads,
    // and ids that are no integers of `u32`, which all three readers refuse.
    let escaped_key = base.to_string().replacen("\"vocab\":", "\"voc\\u0061b\":", 1);
    let model = tokenizer_file::File::read(&escaped_key).unwrap().model.get().to_string();
    assert!(model.contains("voc\\u0061b") && detokenizer::Pieces::scan(&model, &[]).is_none());
    let theirs: Tokenizer = escaped_key.parse().unwrap();
    let largest = theirs.get_vocab(true).into_values().max().unwrap();
    assert_decodes_alike("a key written with escapes", &escaped_key, &theirs, largest);
    for id in [Value::from(5.0), Value::from(-5), Value::from(1u64 << 32)] {
        assert_same(
            &format!("an id of {id}"),
            &edit(&|j| {
                let vocab = j["model"]["vocab"].as_object_mut().unwrap();
                let token = vocab.keys().next_back().unwrap().clone();
                vocab.insert(token, id.clone());
            }),
            false,
        );
    }
    // A model with two vocabularies: the decoding-only reader refuses it.
    let twice = base.to_string().replacen("\"vocab\":", "\"vocab\":{},\"vocab\":", 1);
    assert!(detokenizer::read(&twice).is_err());
    // An id far past the others: the decoding-only reader builds no table of three billion
    // pieces (the crate then refuses the id as past its embeddings), and decodes as the
    // tokenizer does. (Not through `assert_same`: serializing that tokenizer walks every id.)
    let far = edit(&|j| {
        let vocab = j["model"]["vocab"].as_object_mut().unwrap();
        let token = vocab.keys().next_back().unwrap().clone();
        vocab.insert(token, Value::from(3_000_000_000u32));
    });
    let (ours, largest) = detokenizer::read(&far).unwrap();
    assert_eq!(largest, 3_000_000_000);
    let theirs: Tokenizer = far.parse().unwrap();
    for ids in [vec![3_000_000_000], vec![5, 3_000_000_000, 7], (0..600).collect()] {
        assert_eq!(ours.decode(&ids, true).unwrap(), theirs.decode(&ids, true).unwrap(), "{ids:?}");
    }
    assert_same(
        "an id past the others, a gap before it",
        &edit(&|j| {
            let vocab = j["model"]["vocab"].as_object_mut().unwrap();
            let token = vocab.keys().next_back().unwrap().clone();
            vocab.insert(token, Value::from(5000));
        }),
        true,
    );
    // Vocabularies the scan finds no largest id in (an empty one: the ids come from the added
    // tokens), and a Unigram list, whose ids are the indices.
    assert_same(
        "an empty vocabulary",
        &with_model(serde_json::json!({"type": "BPE", "vocab": {}, "merges": []})),
        true,
    );
    let pieces = serde_json::json!([["<unk>", 0.0], ["a", -1.0], ["b", -2.0], ["ab", -1.5], ["ba", -3.0]]);
    assert_same(
        "a Unigram vocabulary",
        &with_model(
            serde_json::json!({"type": "Unigram", "unk_id": 0, "vocab": pieces, "byte_fallback": false}),
        ),
        true,
    );
    assert_same(
        "an added token beyond the vocabulary",
        &edit(&|j| {
            let tokens = j["added_tokens"].as_array_mut().unwrap();
            let mut token = tokens[0].clone();
            token["content"] = Value::from("<new>");
            token["id"] = Value::from(1_000_000);
            tokens.push(token);
        }),
        true,
    );

    // Refusals.
    assert_same("version 2.0", &edit(&|j| j["version"] = Value::from("2.0")), false);
    assert_same(
        "no model",
        &edit(&|j| {
            j.as_object_mut().unwrap().remove("model");
        }),
        false,
    );
    assert_same("unknown model type", &edit(&|j| j["model"]["type"] = Value::from("Tiktoken")), false);
    assert_same(
        "model without vocab",
        &edit(&|j| {
            j["model"].as_object_mut().unwrap().remove("vocab");
        }),
        false,
    );
    assert_same(
        "added token without id",
        &edit(&|j| {
            j["added_tokens"][0].as_object_mut().unwrap().remove("id");
        }),
        false,
    );
    let text = base.to_string();
    assert_same("truncated", &text[..text.len() / 2], false);
    assert_same("not JSON", "{ not json", false);
}
