//! Speculation chosen by measurement.
//!
//! A workload whose `[speculation]` says `speculator = "measured"` leaves it to the authority
//! whether its crate speculates, and how many tokens it drafts. `monogen bench --model DIR`
//! builds the crate once per candidate (no speculation, prompt lookup with 2, 4, … up to
//! `draft_tokens` drafts, and the same with the draft model of `[speculation.draft]` where the
//! table has one), decodes the workload's `typical_text` with each in interleaved
//! rounds, and keeps one [`Record`] per candidate in `rankings/<class>/speculation.toml`.
//! [`decide`] reads them back: a speculating candidate is chosen only where it beats no
//! speculation by the flip rule ([`rankings::judge_rounds`]), so text where drafts are rarely
//! kept decodes without any speculation code. Without fresh records the crate does not
//! speculate, and `check` asks for the measurement.

use serde::{Deserialize, Serialize};

use crate::rankings::{self, Rankings};
use crate::registry::{Registry, sha256_hex};
use crate::workload::{Speculation, Speculator, Workload};

/// The records' file name in a hardware class's folder.
pub const SPECULATION_FILE: &str = "speculation.toml";

/// The fewest tokens the typical text must decode for the rounds' times to choose.
pub const MIN_DECODED: usize = 16;

/// One candidate's measurement on the workload's typical text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    // The key: what the measurement depends on.
    pub workload: String,
    /// [`rankings::shapes_signature`] of the workload.
    pub shapes: String,
    /// sha256 of the rest of the workload ([`Key::of`]): its dtypes, KV cache, batch, serving.
    pub workload_sha256: String,
    /// sha256 of `speculation.typical_text`.
    pub text_sha256: String,
    pub lookup_max: usize,
    pub lookup_min: usize,
    /// [`rankings::measured_source_sha256`] of the prompt-lookup speculator.
    pub source_sha256: String,
    /// sha256 of the `[speculation.draft]` table's TOML, where it has one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub draft_sha256: String,
    /// `none`, `prompt-lookup` or `draft-model`.
    pub speculator: String,
    /// Tokens drafted at most per step (0 for none).
    pub draft_tokens: usize,
    // Where and on what.
    /// sha256 of the weights the crates decoded with, and the folder they were read from.
    pub weights_sha256: String,
    pub model: String,
    pub cpu: String,
    pub cores: usize,
    pub rustc: String,
    pub measured_at: String,
    // The result.
    /// The typical text's tokens, and the tokens each round decoded.
    pub prompt_tokens: usize,
    pub generated: usize,
    /// Tokens drafted and kept over one round.
    pub drafted: usize,
    pub accepted: usize,
    /// Whether it decoded the tokens no speculation decoded.
    pub same_output: bool,
    /// Nanoseconds of one round's decode (the typical number of decode steps), round by round.
    pub median_ns: u64,
    pub rounds_ns: Vec<u64>,
}

/// A candidate of a measured `[speculation]`: `None` for no speculation, else the speculator
/// and the drafts at most.
pub type Candidate = Option<(Speculator, usize)>;

/// A candidate in words: `none`, `prompt lookup with 4 drafts`, `the draft model with 4 drafts`.
pub fn describe(c: Candidate) -> String {
    match c {
        None => "none".into(),
        Some((Speculator::DraftModel, k)) => format!("the draft model with {k} drafts"),
        Some((_, k)) => format!("prompt lookup with {k} drafts"),
    }
}

impl Record {
    /// The candidate it measured.
    pub fn candidate(&self) -> Candidate {
        match self.speculator.as_str() {
            "none" => None,
            "draft-model" => Some((Speculator::DraftModel, self.draft_tokens)),
            _ => Some((Speculator::PromptLookup, self.draft_tokens)),
        }
    }

    /// The share of drafted tokens kept, in percent.
    pub fn kept_percent(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { 100.0 * self.accepted as f64 / self.drafted as f64 }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordFile {
    #[serde(default)]
    pub record: Vec<Record>,
}

/// What a fresh record of `w`'s measurement must have in its key.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub workload: String,
    pub shapes: String,
    pub workload_sha256: String,
    pub text_sha256: String,
    pub lookup_max: usize,
    pub lookup_min: usize,
    pub source_sha256: String,
    pub draft_sha256: String,
}

impl Key {
    /// The key of `w`'s measurement; `None` unless `w` leaves its speculator to measurement.
    pub fn of(w: &Workload, registry: &Registry) -> Option<Key> {
        let s = measured(w)?;
        let source_sha256 = registry
            .implementation("speculator", "prompt-lookup", None)
            .map_or_else(String::new, |imp| rankings::measured_source_sha256(imp, registry));
        // Everything of the workload but the table being decided and the class it is decided for.
        let rest = Workload {
            speculation: None,
            target: crate::workload::Target { hardware: None, ..w.target.clone() },
            ..w.clone()
        };
        Some(Key {
            workload: w.name.clone(),
            shapes: rankings::shapes_signature(w),
            workload_sha256: sha256_hex(rest.canonical_toml().as_bytes()),
            text_sha256: sha256_hex(s.typical_text.as_deref().unwrap_or_default().as_bytes()),
            lookup_max: s.lookup_max,
            lookup_min: s.lookup_min,
            source_sha256,
            draft_sha256: s.draft.as_ref().map_or_else(String::new, |d| {
                sha256_hex(toml::to_string(d).expect("a draft table always serializes").as_bytes())
            }),
        })
    }

    /// Whether `r` was measured with this key.
    pub fn matches(&self, r: &Record) -> bool {
        r.workload == self.workload
            && r.shapes == self.shapes
            && r.workload_sha256 == self.workload_sha256
            && r.text_sha256 == self.text_sha256
            && r.lookup_max == self.lookup_max
            && r.lookup_min == self.lookup_min
            && r.source_sha256 == self.source_sha256
            && r.draft_sha256 == self.draft_sha256
    }

    /// What differs between the key and a record of the same workload, in words.
    fn differences(&self, r: &Record) -> Vec<&'static str> {
        let mut out = Vec::new();
        if r.shapes != self.shapes {
            out.push("the shapes");
        } else if r.workload_sha256 != self.workload_sha256 {
            out.push("the workload (beyond its [speculation])");
        }
        if r.text_sha256 != self.text_sha256 {
            out.push("the typical text");
        }
        if (r.lookup_max, r.lookup_min) != (self.lookup_max, self.lookup_min) {
            out.push("the n-gram lengths");
        }
        if r.source_sha256 != self.source_sha256 {
            out.push("the speculator's source");
        }
        if r.draft_sha256 != self.draft_sha256 {
            out.push("the draft model");
        }
        out
    }
}

/// The `[speculation]` table of `w` if it leaves the speculator to measurement.
pub fn measured(w: &Workload) -> Option<&Speculation> {
    w.speculation.as_ref().filter(|s| s.speculator == Speculator::Measured)
}

/// The candidates of a measured table: none, then prompt lookup with each draft length, then
/// the draft model with each, where the table has one.
pub fn candidates(s: &Speculation) -> Vec<Candidate> {
    let lengths = s.draft_candidates();
    let with = |speculator: Speculator| lengths.iter().map(move |&k| Some((speculator, k)));
    let draft = s.draft.is_some().then(|| with(Speculator::DraftModel)).into_iter().flatten();
    std::iter::once(None).chain(with(Speculator::PromptLookup)).chain(draft).collect()
}

/// The choice made for a measured `[speculation]`, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The table the crate is generated with (`None`: no speculation code).
    pub chosen: Option<Speculation>,
    /// Why, in a sentence or two, with the figures.
    pub reason: String,
    /// Why the workload's hardware class lacks a fresh measurement, where it does.
    pub unmeasured: Option<String>,
}

impl Decision {
    /// The choice in a few words: `none`, `prompt-lookup, N drafts` or `draft-model, N drafts`.
    pub fn summary(&self) -> String {
        match &self.chosen {
            Some(s) => format!("{}, {} drafts", s.speculator.as_str(), s.draft_tokens),
            None => "none".into(),
        }
    }
}

/// The speculation `w`'s crate is generated with, where `w` leaves it to measurement: the
/// fastest candidate of its fresh records on `w`'s hardware class if it beats no speculation by
/// the flip rule, else none. `None` when `w` names its speculator itself.
pub fn decide(w: &Workload, rankings: &Rankings, registry: &Registry) -> Option<Decision> {
    let s = measured(w)?;
    let key = Key::of(w, registry)?;
    let Some(class) = w.target.hardware.as_deref() else {
        return Some(Decision {
            chosen: None,
            reason: "measured, but the workload names no hardware class (target.hardware) whose records \
                     choose: no speculation"
                .into(),
            unmeasured: None,
        });
    };
    let all = rankings.speculation.get(class).map_or(&[][..], Vec::as_slice);
    // A toolchain the repository pins (rust-toolchain.toml) stales records of another, as it
    // does kernels' records.
    let pinned = |r: &Record| {
        rankings.current.rustc_pin.as_ref().is_none_or(|(pin, _)| rankings::rustc_release(&r.rustc) == pin)
    };
    let mine: Vec<&Record> = all.iter().filter(|r| key.matches(r) && pinned(r)).collect();
    let missing: Vec<String> = candidates(s)
        .into_iter()
        .filter(|c| !mine.iter().any(|r| r.candidate() == *c))
        .map(describe)
        .collect();
    if !missing.is_empty() {
        let mut stale: Vec<String> = all
            .iter()
            .filter(|r| r.workload == key.workload && !key.matches(r))
            .flat_map(|r| key.differences(r))
            .map(str::to_string)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if let Some((pin, file)) = &rankings.current.rustc_pin
            && all.iter().any(|r| r.workload == key.workload && key.matches(r) && !pinned(r))
        {
            stale.push(format!("the toolchain ({file} pins rustc {pin})"));
        }
        let why = if stale.is_empty() {
            format!("not measured on {class} (missing: {})", missing.join(", "))
        } else {
            format!("its records on {class} are stale: {} changed since", stale.join(", "))
        };
        return Some(Decision {
            chosen: None,
            reason: format!(
                "measured, but {why}; no speculation until `monogen bench WORKLOAD --model DIR` measures it"
            ),
            unmeasured: Some(why),
        });
    }
    let of = |c: Candidate| {
        mine.iter().copied().find(|r| r.candidate() == c).expect("every candidate is measured")
    };
    let none = of(None);
    // A text the model ends at once times nothing but noise.
    if none.generated < MIN_DECODED {
        return Some(Decision {
            chosen: None,
            reason: format!(
                "measured on {class}, but the typical text decoded only {} token(s) before the model ended it, too few to time: no speculation; give a typical_text the model goes on from (the prompt of a typical request, as the crate receives it)",
                none.generated
            ),
            unmeasured: None,
        });
    }
    let mut lines = vec![format!(
        "measured on {class} ({}, {} rounds of {} decode steps after the typical text's {} tokens): none {}",
        none.measured_at,
        none.rounds_ns.len(),
        none.generated,
        none.prompt_tokens,
        crate::plan::human_ns(none.median_ns as f64)
    )];
    let mut best: Option<((Speculator, usize), rankings::Verdict)> = None;
    for c in candidates(s).into_iter().flatten() {
        let r = of(Some(c));
        let verdict = rankings::judge_rounds(&r.rounds_ns, &none.rounds_ns);
        lines.push(format!(
            "{} {} ({:.2}x none's speed, {:.0}% of {} drafts kept{})",
            describe(Some(c)),
            crate::plan::human_ns(r.median_ns as f64),
            1.0 / verdict.ratio,
            r.kept_percent(),
            r.drafted,
            if r.same_output { "" } else { "; its tokens differed from none's" }
        ));
        // Only a candidate that decoded none's tokens competes (a difference is a tie of
        // logits broken the other way, or a defect).
        if r.same_output && verdict.beats && best.is_none_or(|(_, b)| verdict.ratio < b.ratio) {
            best = Some((c, verdict));
        }
    }
    let (chosen, conclusion) = match best {
        Some(((speculator, k), v)) => (
            Some(s.concrete(speculator, k)),
            format!(
                "{}: {:.2}x none's speed, beyond the noise margin of {:.0}%",
                describe(Some((speculator, k))),
                1.0 / v.ratio,
                v.margin * 100.0
            ),
        ),
        None => (
            None,
            "none: no speculating candidate beats it beyond the noise, so the crate has no speculation code"
                .into(),
        ),
    };
    lines.push(format!("chosen: {conclusion}"));
    Some(Decision { chosen, reason: lines.join("; "), unmeasured: None })
}

/// Replaces `class`'s records of `key`'s workload with `new`.
pub fn replace(rankings: &mut Rankings, class: &str, workload: &str, new: Vec<Record>) {
    let list = rankings.speculation.entry(class.to_string()).or_default();
    list.retain(|r| r.workload != workload);
    list.extend(new);
    list.sort_by(|a, b| (&a.workload, a.candidate()).cmp(&(&b.workload, b.candidate())));
}

/// The path (relative to the database's folder) and text of `class`'s speculation records.
pub fn render(rankings: &Rankings, class: &str) -> (std::path::PathBuf, String) {
    let path = std::path::Path::new(class).join(SPECULATION_FILE);
    let file = RecordFile { record: rankings.speculation.get(class).cloned().unwrap_or_default() };
    let body = toml::to_string(&file).expect("speculation records always serialize");
    let text = format!(
        "# Speculation measured on hardware class `{class}`, written by `monogen bench --model DIR` for\n\
         # workloads whose [speculation] says speculator = \"measured\": each candidate's crate decoding\n\
         # the workload's typical text with real weights, in interleaved rounds (docs/rankings.md).\n\n{body}"
    );
    (path, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(text: &str) -> Workload {
        let toml = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../workloads/stories260k-cpu-f32-lookup.toml"),
        )
        .unwrap()
        .replace(
            "speculator = \"prompt-lookup\"",
            &format!("speculator = \"measured\"\ntypical_text = \"{text}\""),
        );
        crate::workload::WorkloadSource::from_text("w.toml", &toml).parse().unwrap()
    }

    fn record(w: &Workload, key: &Key, candidate: Option<usize>, rounds: &[u64]) -> Record {
        record_of(w, key, candidate.map(|k| (Speculator::PromptLookup, k)), rounds)
    }

    fn record_of(w: &Workload, key: &Key, candidate: Candidate, rounds: &[u64]) -> Record {
        let mut sorted = rounds.to_vec();
        sorted.sort();
        Record {
            workload: w.name.clone(),
            shapes: key.shapes.clone(),
            workload_sha256: key.workload_sha256.clone(),
            text_sha256: key.text_sha256.clone(),
            lookup_max: key.lookup_max,
            lookup_min: key.lookup_min,
            source_sha256: key.source_sha256.clone(),
            draft_sha256: key.draft_sha256.clone(),
            speculator: candidate.map_or(Speculator::None, |(s, _)| s).as_str().into(),
            draft_tokens: candidate.map_or(0, |(_, k)| k),
            weights_sha256: "w".into(),
            model: "m".into(),
            cpu: "cpu".into(),
            cores: 2,
            rustc: "rustc".into(),
            measured_at: "2026-12-07T06:00:00Z".into(),
            prompt_tokens: 40,
            generated: 128,
            drafted: 100,
            accepted: 50,
            same_output: true,
            median_ns: sorted[sorted.len() / 2],
            rounds_ns: rounds.to_vec(),
        }
    }

    fn registry() -> Registry {
        Registry::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")).unwrap()
    }

    #[test]
    fn candidates_are_powers_of_two_up_to_the_most_drafts() {
        let w = workload("once upon a time");
        let s = measured(&w).unwrap();
        let lookup = Speculator::PromptLookup;
        assert_eq!(candidates(s), vec![None, Some((lookup, 2)), Some((lookup, 4))]);
        for (most, expected) in [(1, vec![1]), (2, vec![2]), (6, vec![2, 4, 6]), (8, vec![2, 4, 8])] {
            assert_eq!(s.concrete(Speculator::Measured, most).draft_candidates(), expected);
        }
    }

    #[test]
    fn the_fastest_candidate_beyond_the_noise_is_chosen_else_none() {
        let registry = registry();
        let w = workload("once upon a time");
        let key = Key::of(&w, &registry).unwrap();
        let mut rankings = Rankings::default();
        // Without records: none, and the measurement is asked for.
        let d = decide(&w, &rankings, &registry).unwrap();
        assert_eq!(d.chosen, None);
        assert!(d.unmeasured.as_deref().unwrap().contains("not measured on amd-epyc-2c"), "{d:?}");

        let none = [100, 102, 98, 101, 99];
        let set = |rankings: &mut Rankings, two: &[u64], four: &[u64]| {
            let records = vec![
                record(&w, &key, None, &none),
                record(&w, &key, Some(2), two),
                record(&w, &key, Some(4), four),
            ];
            replace(rankings, "amd-epyc-2c", &w.name, records);
        };
        set(&mut rankings, &[60, 61, 59, 60, 62], &[50, 51, 49, 50, 52]);
        let d = decide(&w, &rankings, &registry).unwrap();
        assert_eq!(
            d.chosen.as_ref().map(|s| (s.speculator, s.draft_tokens)),
            Some((Speculator::PromptLookup, 4))
        );
        assert!(d.reason.contains("chosen: prompt lookup with 4 drafts: 2.00x none's speed"), "{}", d.reason);
        assert_eq!(d.unmeasured, None);
        // Inside the noise: none.
        set(&mut rankings, &[99, 101, 100, 98, 100], &[103, 104, 99, 100, 102]);
        let d = decide(&w, &rankings, &registry).unwrap();
        assert_eq!(d.chosen, None, "{}", d.reason);
        assert!(d.reason.contains("chosen: none"), "{}", d.reason);
        // A candidate whose tokens differed never wins.
        set(&mut rankings, &[60, 61, 59, 60, 62], &[50, 51, 49, 50, 52]);
        for r in rankings.speculation.get_mut("amd-epyc-2c").unwrap() {
            r.same_output = r.draft_tokens != 4;
        }
        let d = decide(&w, &rankings, &registry).unwrap();
        assert_eq!(d.chosen.map(|s| s.draft_tokens), Some(2), "{}", d.reason);

        // Another typical text makes them stale.
        let other = workload("the end");
        let d = decide(&other, &rankings, &registry).unwrap();
        assert_eq!(d.chosen, None);
        assert!(d.unmeasured.as_deref().unwrap().contains("the typical text changed"), "{d:?}");
        // So does another KV cache dtype, which the shapes do not name.
        let mut other = w.clone();
        other.kv_cache.dtype = crate::workload::KvDtype::Bf16;
        let d = decide(&other, &rankings, &registry).unwrap();
        assert!(
            d.unmeasured.as_deref().unwrap().contains("the workload (beyond its [speculation]) changed"),
            "{d:?}"
        );
        // A pinned toolchain other than the records' stales them too.
        let mut pinned = rankings.clone();
        pinned.current.rustc_pin = Some(("1.99.0".into(), "rust-toolchain.toml".into()));
        let d = decide(&w, &pinned, &registry).unwrap();
        assert!(
            d.unmeasured
                .as_deref()
                .unwrap()
                .contains("the toolchain (rust-toolchain.toml pins rustc 1.99.0) changed"),
            "{d:?}"
        );
        // A text the model ends at once chooses nothing.
        let mut short = rankings.clone();
        for r in short.speculation.get_mut("amd-epyc-2c").unwrap() {
            r.generated = 1;
        }
        let d = decide(&w, &short, &registry).unwrap();
        assert_eq!((d.chosen.as_ref(), d.unmeasured.as_ref()), (None, None));
        assert!(d.reason.contains("decoded only 1 token(s)"), "{}", d.reason);
        // Without a hardware class, none, and nothing to measure.
        let mut unclassed = w.clone();
        unclassed.target.hardware = None;
        let d = decide(&unclassed, &rankings, &registry).unwrap();
        assert_eq!((d.chosen, d.unmeasured), (None, None));
    }

    /// `workload(text)` with a draft model: the same model held in `dtype`.
    fn with_draft(text: &str, dtype: &str) -> Workload {
        let mut toml = toml::to_string(&workload(text)).unwrap();
        let model = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../workloads/stories260k-cpu-f32-lookup.toml"),
        )
        .unwrap();
        let start = model.find("[model]\n").unwrap() + "[model]\n".len();
        let table = &model[start..start + model[start..].find("\n\n").unwrap()];
        toml.push_str(&format!(
            "\n[speculation.draft.model]\n{table}\n\n[speculation.draft.weights]\ndtype = \"{dtype}\"\n"
        ));
        crate::workload::WorkloadSource::from_text("w.toml", &toml).parse().unwrap()
    }

    #[test]
    fn a_draft_model_is_one_more_candidate_and_may_be_chosen() {
        let registry = registry();
        let w = with_draft("once upon a time", "int4");
        let s = measured(&w).unwrap();
        let (lookup, draft) = (Speculator::PromptLookup, Speculator::DraftModel);
        assert_eq!(
            candidates(s),
            vec![None, Some((lookup, 2)), Some((lookup, 4)), Some((draft, 2)), Some((draft, 4))]
        );
        let key = Key::of(&w, &registry).unwrap();
        assert!(!key.draft_sha256.is_empty());
        let mut rankings = Rankings::default();
        let records = vec![
            record_of(&w, &key, None, &[100, 102, 98, 101, 99]),
            record_of(&w, &key, Some((lookup, 2)), &[99, 101, 100, 98, 100]),
            record_of(&w, &key, Some((lookup, 4)), &[103, 104, 99, 100, 102]),
            record_of(&w, &key, Some((draft, 2)), &[70, 71, 69, 70, 72]),
            record_of(&w, &key, Some((draft, 4)), &[60, 61, 59, 60, 62]),
        ];
        replace(&mut rankings, "amd-epyc-2c", &w.name, records);
        let d = decide(&w, &rankings, &registry).unwrap();
        assert_eq!(d.summary(), "draft-model, 4 drafts", "{}", d.reason);
        assert!(
            d.reason.contains("chosen: the draft model with 4 drafts: 1.67x none's speed"),
            "{}",
            d.reason
        );
        assert!(d.chosen.as_ref().unwrap().draft.is_some());
        // Prompt lookup's candidates have no draft model.
        assert_eq!(s.concrete(lookup, 2).draft, None);
        // `build` then generates the draft model's crate.
        let selection = crate::resolve::Selection { rankings: rankings.clone(), ..Default::default() };
        let plan =
            crate::resolve::resolve(&w, &registry, &selection, std::path::Path::new("w.toml")).unwrap();
        let crate::plan::Consts::Llama(c) = &plan.consts else { panic!("a decoder") };
        assert_eq!(c.draft().map(|d| d.name.as_str()), Some("stories260k-cpu-f32-lookup-draft"));
        assert_eq!(c.speculation.as_ref().unwrap().draft_tokens, 4);
        // Another draft model stales the records.
        let other = with_draft("once upon a time", "int8");
        let d = decide(&other, &rankings, &registry).unwrap();
        assert!(d.unmeasured.as_deref().unwrap().contains("the draft model changed"), "{d:?}");
    }

    #[test]
    fn records_render_and_load_back() {
        let registry = registry();
        let w = workload("once upon a time");
        let key = Key::of(&w, &registry).unwrap();
        let mut rankings = Rankings::default();
        replace(
            &mut rankings,
            "c",
            &w.name,
            vec![record(&w, &key, Some(2), &[5]), record(&w, &key, None, &[6])],
        );
        let (path, text) = render(&rankings, "c");
        assert_eq!(path, std::path::Path::new("c/speculation.toml"));
        let back: RecordFile = toml::from_str(&text).unwrap();
        assert_eq!(back.record, rankings.speculation["c"]);
        assert_eq!(back.record[0].candidate(), None, "none first");
    }
}
