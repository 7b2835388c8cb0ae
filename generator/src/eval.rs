//! `monogen eval`: the quality gate of a workload whose weights are not f32.
//!
//! The workload's crate (the subject, exactly as `build` writes it) and its f32 twin (the same
//! workload with f32 weights, activations and KV cache, its kernels by declared priority) are
//! written side by side under `target/monogen-bench/eval/<workload>/`, with a harness that
//! depends on both (`templates/eval/`), and built in release. The harness reads an evaluation
//! text: a decoder's two crates are teacher-forced over it a window at a time (top-1 agreement,
//! mean and p99 KL divergence of the subject's next-token distribution from f32's, both
//! perplexities); an encoder's embed each line (cosine similarity to f32's vectors).
//!
//! Each run is recorded in `<rankings>/quality/<workload>.toml`, keyed by the sha256 of the
//! weights, of the subject's numerics (every source file of the crate but its command line and
//! server) and of the text. `check` asks every workload whose weights are not f32 for a record
//! of its current crate and text that clears its `[quality]` bar, or for a waiver.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::emit::{MONOGEN_VERSION, Output};
use crate::workload::{Activations, Dtype, KvCache, KvDtype, Quality, Request, Weights, Workload};
use crate::{Error, Project, shown};

/// The folder of the ranking database that holds evaluation records, one file a workload.
pub const QUALITY_DIR: &str = "quality";

/// The template that is monogen's default evaluation text.
const DEFAULT_TEXT: &str = "eval/default.txt";

/// The crate's files that do not compute what the model outputs: its command line and its
/// server. A change to them keeps an evaluation record fresh.
const NOT_NUMERICS: &[&str] = &[
    "src/main.rs",
    "src/serve.rs",
    "src/http.rs",
    "src/engine.rs",
    "src/metrics.rs",
    "src/generate.rs",
    "src/detokenizer.rs",
];

/// What an evaluation measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Figures {
    /// A decoder over `positions` next-token predictions.
    Decoder {
        positions: usize,
        /// Share of positions where the subject's most likely next token is f32's.
        top1: f64,
        /// Mean KL divergence of the subject's next-token distribution from f32's (nats).
        mean_kl: f64,
        /// Its 99th percentile.
        p99_kl: f64,
        /// The subject's perplexity on the text, and f32's.
        perplexity: f64,
        perplexity_f32: f64,
    },
    /// An encoder over `sentences` lines of the text.
    Encoder { sentences: usize, mean_cosine: f64, min_cosine: f64 },
}

impl Figures {
    /// The figures as `explain`-style text.
    pub fn render(&self) -> String {
        match self {
            Figures::Decoder { positions, top1, mean_kl, p99_kl, perplexity, perplexity_f32 } => format!(
                "{positions} positions: top-1 agreement {:.2}%, mean KL {mean_kl:.3e}, p99 KL {p99_kl:.3e}, perplexity {perplexity:.4} (f32 {perplexity_f32:.4})",
                top1 * 100.0
            ),
            Figures::Encoder { sentences, mean_cosine, min_cosine } => {
                format!("{sentences} sentences: mean cosine {mean_cosine:.6}, min cosine {min_cosine:.6}")
            }
        }
    }

    /// How these figures miss the bar `q`, one line a bar missed.
    pub fn misses(&self, q: &Quality) -> Vec<String> {
        let mut out = Vec::new();
        match *self {
            Figures::Decoder { top1, mean_kl, .. } => {
                if let Some(max) = q.max_mean_kl
                    && mean_kl > max
                {
                    out.push(format!("mean KL {mean_kl:.3e} is above quality.max_mean_kl {max:e}"));
                }
                if let Some(min) = q.min_top1
                    && top1 < min
                {
                    out.push(format!("top-1 agreement {top1:.4} is below quality.min_top1 {min}"));
                }
            }
            Figures::Encoder { mean_cosine, .. } => {
                if let Some(min) = q.min_cosine
                    && mean_cosine < min
                {
                    out.push(format!("mean cosine {mean_cosine:.6} is below quality.min_cosine {min}"));
                }
            }
        }
        out
    }
}

/// One evaluation, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// sha256 of the subject's numerics ([`numerics_sha256`]).
    pub crate_sha256: String,
    /// sha256 of the evaluation text, and where it came from.
    pub text_sha256: String,
    pub text: String,
    /// sha256 of the weights' files, and the folder they were read from.
    pub weights_sha256: String,
    pub model: String,
    pub monogen: String,
    pub measured_at: String,
    #[serde(flatten)]
    pub figures: Figures,
}

/// `<rankings>/quality/<workload>.toml`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct QualityFile {
    #[serde(default)]
    eval: Vec<EvalRecord>,
}

/// What `monogen eval` did.
#[derive(Debug, Clone)]
pub struct EvalRun {
    pub workload: String,
    pub record: EvalRecord,
    /// How the figures miss the workload's bar (empty: cleared, or no bar).
    pub misses: Vec<String>,
    /// The bar, when the workload sets one.
    pub bar: Option<Quality>,
    /// The records file written.
    pub recorded: PathBuf,
}

/// Whether a workload's crate loses precision to f32 and so needs an evaluation: its weights,
/// its products' activations or its KV cache are not f32.
pub fn needs_eval(w: &Workload) -> bool {
    w.weights.dtype != Dtype::F32
        || w.weights.activations != Activations::F32
        || w.kv_cache.dtype != KvDtype::F32
}

/// sha256 of the crate's numerics: every file of `output` under `src/` but [`NOT_NUMERICS`].
pub fn numerics_sha256(output: &Output) -> String {
    let mut hasher = Sha256::new();
    for (path, text) in &output.files {
        let shown = path.to_string_lossy().replace('\\', "/");
        if !shown.starts_with("src/") || NOT_NUMERICS.contains(&shown.as_str()) {
            continue;
        }
        hasher.update(shown.as_bytes());
        hasher.update([0]);
        hasher.update((text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    }
    hex(&hasher.finalize())
}

/// The evaluation text of workload `w` (read from `path`): `quality.text`, relative to the
/// workload file, or monogen's default text; with the name records give it.
pub fn text_of(project: &Project, w: &Workload, path: &Path) -> Result<(String, Vec<u8>), Error> {
    match w.quality.as_ref().and_then(|q| q.text.as_deref()) {
        Some(text) => {
            let file = path.parent().unwrap_or(Path::new(".")).join(text);
            let bytes = std::fs::read(&file).map_err(|e| Error::io(&file, e))?;
            Ok((text.to_string(), bytes))
        }
        None => Ok(("default".to_string(), project.templates.get(DEFAULT_TEXT)?.as_bytes().to_vec())),
    }
}

/// The records file of workload `name`.
pub fn records_path(project: &Project, name: &str) -> PathBuf {
    project.rankings_dir.join(QUALITY_DIR).join(format!("{name}.toml"))
}

/// The evaluation records of workload `name` (none when it has no file).
pub fn records(project: &Project, name: &str) -> Result<Vec<EvalRecord>, Error> {
    let path = records_path(project, name);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let file: QualityFile = toml::from_str(&text).map_err(|e| {
        Error::Refused(format!(
            "{} cannot be read: {}; delete it and run `monogen eval` again",
            shown(&path),
            e.message().trim()
        ))
    })?;
    Ok(file.eval)
}

/// What the records say of the crate `output` of workload `w` (at `path`) over its text.
struct Lookup {
    /// The text's name (`default`, or `quality.text`).
    text: String,
    /// The newest record of exactly this crate over the text.
    current: Option<EvalRecord>,
    /// Whether any crate of the workload was evaluated over the text.
    any: bool,
}

fn lookup(project: &Project, w: &Workload, path: &Path, output: &Output) -> Result<Lookup, Error> {
    let (text, bytes) = text_of(project, w, path)?;
    let text_sha256 = hex(&Sha256::digest(&bytes));
    let crate_sha256 = numerics_sha256(output);
    let of_text: Vec<EvalRecord> =
        records(project, &w.name)?.into_iter().filter(|r| r.text_sha256 == text_sha256).collect();
    let any = !of_text.is_empty();
    let current = of_text
        .into_iter()
        .filter(|r| r.crate_sha256 == crate_sha256)
        .max_by(|a, b| a.measured_at.cmp(&b.measured_at));
    Ok(Lookup { text, current, any })
}

/// Why `check` finds the quality gate of workload `w` (at `path`, its crate `output`) not
/// passed: no bar and no waiver, no record of this crate and text, or a record over the bar.
/// Empty when it passes or does not apply.
pub fn gate(project: &Project, w: &Workload, path: &Path, output: &Output) -> Result<Vec<String>, Error> {
    if !needs_eval(w) {
        return Ok(Vec::new());
    }
    let dtype = if w.weights.dtype != Dtype::F32 {
        format!("{} weights", w.weights.dtype.as_str())
    } else if w.weights.activations != Activations::F32 {
        "bf16 activations".to_string()
    } else {
        format!("a {} KV cache", w.kv_cache.dtype.as_str())
    };
    let Some(q) = &w.quality else {
        return Ok(vec![format!(
            "it has {dtype} and no [quality] bar: set one (docs/quality.md), or say why it is not evaluated in quality.waived"
        )]);
    };
    if q.waived.is_some() {
        return Ok(Vec::new());
    }
    let Lookup { text: text_name, current, any } = lookup(project, w, path, output)?;
    Ok(match current {
        Some(r) => r
            .figures
            .misses(q)
            .into_iter()
            .map(|m| format!("its evaluation ({}) failed its bar: {m}", r.measured_at))
            .collect(),
        None if any => vec![format!(
            "its evaluation record is stale: the crate's numerics changed since it was evaluated over the {text_name} text"
        )],
        None => vec![format!("it has {dtype} and no evaluation record over the {text_name} text")],
    })
}

/// Whether the crate a deployment repository keeps in `dir` needs `eval` before `check` passes
/// it (`monogen eval --stale`).
#[derive(Debug, Clone, PartialEq)]
pub enum Stale {
    /// It computes in less than f32 against a bar, and no record is of its current numerics
    /// over its text: why.
    Evaluate(String),
    /// It needs no evaluation now: why.
    Nothing(String),
}

/// What `eval --stale` does with the crate in `dir`: evaluate it where its workload computes in
/// less than f32, has a bar (not a waiver), and no record of the crate as `build --crate` would
/// write it now over its text, or, where its model folder `model` is there, none made on that
/// folder's weights (a new checkpoint is evaluated again).
pub fn stale(project: &Project, dir: &Path, model: Option<&Path>) -> Result<Stale, Error> {
    let path = crate::check::crate_workload(dir)?;
    let w = project.read_workload(&path)?;
    if !needs_eval(&w) {
        return Ok(Stale::Nothing("f32 weights, activations and KV cache".into()));
    }
    let Some(q) = &w.quality else {
        return Ok(Stale::Nothing("it has no [quality] bar to evaluate against (check asks for one)".into()));
    };
    if let Some(reason) = &q.waived {
        return Ok(Stale::Nothing(format!("its evaluation is waived: {reason}")));
    }
    let output = project.emit(&project.plan_for(&w, &path, dir)?)?;
    let Lookup { text, current, any } = lookup(project, &w, &path, &output)?;
    let model = model.filter(|m| m.join("config.json").is_file());
    if let (Some(r), Some(model)) = (&current, model) {
        let weights = weights_sha256(model)?;
        let of_weights = |x: &EvalRecord| {
            (x.crate_sha256.as_str(), x.text_sha256.as_str(), x.weights_sha256.as_str())
                == (r.crate_sha256.as_str(), r.text_sha256.as_str(), weights.as_str())
        };
        if !records(project, &w.name)?.iter().any(of_weights) {
            return Ok(Stale::Evaluate(format!(
                "the weights of {} are not those it was evaluated on over the {text} text ({})",
                shown(model),
                r.model
            )));
        }
    }
    Ok(match current {
        Some(r) => Stale::Nothing(format!("its record over the {text} text is current ({})", r.measured_at)),
        None if any => {
            Stale::Evaluate(format!("its numerics changed since it was evaluated over the {text} text"))
        }
        None => Stale::Evaluate(format!("it has no evaluation record over the {text} text")),
    })
}

/// `plan`, unless it changes a choice of the crate in `out_dir` and an evaluation of exactly
/// the crate it makes missed the workload's bar: then the plan that keeps the crate's choices
/// for those interfaces, each saying why. A fixed kernel makes another crate, which is adopted
/// until an evaluation of it misses the bar in turn.
pub fn keep_what_clears_the_bar(
    project: &Project,
    w: &Workload,
    path: &Path,
    out_dir: &Path,
    plan: crate::plan::Plan,
) -> Result<crate::plan::Plan, Error> {
    let Some(q) = w.quality.as_ref().filter(|q| q.has_bar()) else { return Ok(plan) };
    let locked = crate::check::locked_choices(out_dir);
    let changed: std::collections::BTreeMap<String, (String, String)> = plan
        .interfaces
        .iter()
        .filter_map(|i| {
            let old = locked.get(&i.module())?;
            (old != &i.chosen.name).then(|| (i.module(), (old.clone(), i.chosen.name.clone())))
        })
        .collect();
    if !needs_eval(w) || changed.is_empty() {
        return Ok(plan);
    }
    if records(project, &w.name)?.is_empty() {
        return Ok(plan);
    }
    let Some(failed) = lookup(project, w, path, &project.emit(&plan)?)?.current else { return Ok(plan) };
    let misses = failed.figures.misses(q);
    if misses.is_empty() {
        return Ok(plan);
    }
    let flips: Vec<String> = changed.iter().map(|(i, (old, new))| format!("{i} {old} → {new}")).collect();
    let because = format!(
        "kept: the crate with {} failed its quality bar when evaluated ({}: {})",
        flips.join(", "),
        failed.measured_at,
        misses.join("; ")
    );
    let forced = changed.into_iter().map(|(i, (old, _))| (i, old)).collect();
    project.plan_forced_because(w, path, out_dir, forced, Some(because))
}

/// The quality gate of workload `w` (at `path`, its crate `output`) as `explain` says it: the
/// bar, and the figures of the current crate's evaluation or what is missing; `None` for a
/// workload whose weights are f32 and that sets no bar.
pub fn describe(
    project: &Project,
    w: &Workload,
    path: &Path,
    output: &Output,
) -> Result<Option<String>, Error> {
    let Some(q) = &w.quality else {
        return Ok(needs_eval(w).then(|| {
            "quality: no [quality] bar; `monogen check` fails until one is set (docs/quality.md)".to_string()
        }));
    };
    if let Some(reason) = &q.waived {
        return Ok(Some(format!("quality: not evaluated ({reason})")));
    }
    let mut bars = Vec::new();
    if let Some(v) = q.max_mean_kl {
        bars.push(format!("mean KL ≤ {v:e}"));
    }
    if let Some(v) = q.min_top1 {
        bars.push(format!("top-1 ≥ {v}"));
    }
    if let Some(v) = q.min_cosine {
        bars.push(format!("mean cosine ≥ {v}"));
    }
    let Lookup { text: text_name, current, .. } = lookup(project, w, path, output)?;
    let status = match current {
        Some(r) => {
            let misses = r.figures.misses(q);
            let verdict = if misses.is_empty() {
                "clears it".to_string()
            } else {
                format!("FAILS it: {}", misses.join("; "))
            };
            format!("{} (evaluated {} on {}): {verdict}", r.figures.render(), r.measured_at, r.model)
        }
        None => format!(
            "this crate has not been evaluated over the {text_name} text: `monogen eval {} --model MODEL_DIR`",
            shown(path)
        ),
    };
    Ok(Some(format!("quality: bar {}; {status}", bars.join(", "))))
}

/// The f32 twin of `w`: the same model and request with f32 weights, activations and KV cache,
/// no server, and kernels by declared priority, named `<name>-f32-reference`.
fn twin(w: &Workload) -> Workload {
    let mut t = w.clone();
    t.name = format!("{}-f32-reference", w.name);
    t.description = None;
    t.weights = Weights { dtype: Dtype::F32, activations: Activations::F32, classifier_dtype: None };
    t.kv_cache = KvCache::default();
    t.target.hardware = None;
    t.serving = None;
    t.quality = None;
    t.source = Default::default();
    t
}

/// Evaluates workload `path` (its crate in `crate_dir` where given, for the incumbents of its
/// choices) on the model in `model` over `text` (the workload's text unless given), and records
/// the figures. `progress(done, total)` follows the harness.
pub fn eval(
    project: &Project,
    path: &Path,
    crate_dir: Option<&Path>,
    model: &Path,
    text: Option<&Path>,
    mut progress: impl FnMut(usize, usize),
) -> Result<EvalRun, Error> {
    let w = project.read_workload(path)?;
    if w.target.device == crate::workload::Device::Cuda {
        return Err(Error::Refused(format!(
            "{} targets a CUDA GPU: its evaluation runs on the GPU, in the device check (bench/gpu_check.sh)",
            shown(path)
        )));
    }
    if !model.join("config.json").is_file() {
        return Err(Error::Refused(format!(
            "{} is not a model folder (it has no config.json); --model takes the Hugging Face folder of the workload's model",
            shown(model)
        )));
    }
    let plan = match crate_dir {
        Some(dir) => project.plan_for(&w, path, dir)?,
        None => project.plan(&w, path)?,
    };
    let output = project.emit(&plan)?;
    let crate_sha256 = numerics_sha256(&output);
    let reference_plan = project.plan(&twin(&w), path)?;
    let reference = project.emit(&reference_plan)?;

    let (text_name, text) = match text {
        Some(file) => (shown(file), std::fs::read(file).map_err(|e| Error::io(file, e))?),
        None => text_of(project, &w, path)?,
    };
    let dir = crate::bench::bench_dir(project).join("eval").join(&w.name);
    crate::write::write(&dir.join("subject"), &output, true)?;
    crate::write::write(&dir.join("reference"), &reference, true)?;
    let harness = dir.join("harness");
    let name = format!("{}-eval", w.name);
    let context = serde_json::json!({
        "workload": w.name,
        "name": name,
        "subject": plan.name,
        "reference": reference_plan.name,
    });
    let main = match w.request {
        Request::Decoder(_) => "eval/llama.rs",
        Request::Encoder(_) => "eval/bert.rs",
    };
    let text_file = dir.join("text.txt");
    crate::write::write_file(&text_file, &text)?;
    crate::write::write_file(
        &harness.join("Cargo.toml"),
        project.templates.render("eval/Cargo.toml.j2", &context)?.as_bytes(),
    )?;
    crate::write::write_file(&harness.join("src/main.rs"), project.templates.get(main)?.as_bytes())?;
    crate::bench::seed_lock(project, &harness)?;
    let target = crate::bench::crates_target_dir(project);
    let exe = crate::bench::build_release(&harness, &target, &name, "the evaluation harness", "")?;

    let figures = run_harness(&exe, model, &text_file, &mut progress)?;
    let record = EvalRecord {
        crate_sha256,
        text_sha256: hex(&Sha256::digest(&text)),
        text: text_name,
        weights_sha256: weights_sha256(model)?,
        model: shown(model),
        monogen: MONOGEN_VERSION.to_string(),
        measured_at: crate::bench::now_utc(),
        figures,
    };
    let mut all = records(project, &w.name)?;
    // One record per crate, text and weights: the newest.
    all.retain(|r| {
        (r.crate_sha256.as_str(), r.text_sha256.as_str(), r.weights_sha256.as_str())
            != (record.crate_sha256.as_str(), record.text_sha256.as_str(), record.weights_sha256.as_str())
    });
    all.push(record.clone());
    all.sort_by(|a, b| a.measured_at.cmp(&b.measured_at));
    let recorded = records_path(project, &w.name);
    let header = format!(
        "# Evaluations of workload `{}` against its f32 twin, written by `monogen eval` (docs/quality.md).\n",
        w.name
    );
    let body = toml::to_string(&QualityFile { eval: all })
        .map_err(|e| Error::Refused(format!("cannot write the evaluation record: {e}")))?;
    crate::write::write_file(&recorded, format!("{header}\n{body}").as_bytes())?;
    let bar = w.quality.clone().filter(Quality::has_bar);
    let misses = bar.as_ref().map(|q| record.figures.misses(q)).unwrap_or_default();
    Ok(EvalRun { workload: w.name, record, misses, bar, recorded })
}

/// Runs the harness; returns its figures.
fn run_harness(
    exe: &Path,
    model: &Path,
    text: &Path,
    progress: &mut impl FnMut(usize, usize),
) -> Result<Figures, Error> {
    let mut child = Command::new(exe)
        .arg(model)
        .arg(text)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(exe, e))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut figures = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| Error::io(exe, e))?;
        let value: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
            Error::Refused(format!("the evaluation harness printed a line monogen cannot read ({e}): {line}"))
        })?;
        if let Some(f) = value.get("figures") {
            figures = Some(serde_json::from_value::<Figures>(f.clone()).map_err(|e| {
                Error::Refused(format!(
                    "the evaluation harness printed figures monogen cannot read ({e}): {line}"
                ))
            })?);
        } else if let (Some(done), Some(total)) = (value["done"].as_u64(), value["total"].as_u64()) {
            progress(done as usize, total as usize);
        }
    }
    let status = child.wait().map_err(|e| Error::io(exe, e))?;
    let errors = errors.join().unwrap_or_default();
    match (status.success(), figures) {
        (true, Some(figures)) => Ok(figures),
        _ => Err(Error::Refused(format!(
            "the evaluation failed on {}: {}",
            shown(model),
            if errors.trim().is_empty() { status.to_string() } else { errors.trim().to_string() }
        ))),
    }
}

/// sha256 of the weights in `model`: model.safetensors, or the shard index and every shard.
pub(crate) fn weights_sha256(model: &Path) -> Result<String, Error> {
    let single = model.join("model.safetensors");
    let index = model.join("model.safetensors.index.json");
    let mut files = Vec::new();
    if single.is_file() {
        files.push(single);
    } else if index.is_file() {
        files.push(index.clone());
        let mut shards: Vec<PathBuf> = std::fs::read_dir(model)
            .map_err(|e| Error::io(model, e))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "safetensors")
                    && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("model-"))
            })
            .collect();
        shards.sort();
        files.extend(shards);
    } else {
        return Err(Error::Refused(format!(
            "{} has neither model.safetensors nor model.safetensors.index.json",
            shown(model)
        )));
    }
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    for file in files {
        let mut f = std::fs::File::open(&file).map_err(|e| Error::io(&file, e))?;
        loop {
            let n = f.read(&mut buffer).map_err(|e| Error::io(&file, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
        }
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_miss_exactly_the_bars_they_do_not_clear() {
        let f = Figures::Decoder {
            positions: 100,
            top1: 0.97,
            mean_kl: 2e-3,
            p99_kl: 1e-2,
            perplexity: 5.0,
            perplexity_f32: 4.9,
        };
        let bar = |kl: f64, top1: f64| Quality {
            max_mean_kl: Some(kl),
            min_top1: Some(top1),
            ..Quality::default()
        };
        assert!(f.misses(&bar(5e-3, 0.95)).is_empty());
        let misses = f.misses(&bar(1e-3, 0.98));
        assert_eq!(misses.len(), 2, "{misses:?}");
        assert!(
            misses[0].contains("above quality.max_mean_kl") && misses[1].contains("below quality.min_top1")
        );
        let e = Figures::Encoder { sentences: 10, mean_cosine: 0.995, min_cosine: 0.99 };
        assert!(e.misses(&Quality { min_cosine: Some(0.99), ..Quality::default() }).is_empty());
        assert_eq!(e.misses(&Quality { min_cosine: Some(0.999), ..Quality::default() }).len(), 1);
    }

    /// Every workload that computes in less than f32 is gated: weights, activations, or a
    /// bf16 KV cache beside f32 weights (whose `init` bar is bf16's).
    #[test]
    fn a_bf16_kv_cache_alone_needs_an_evaluation() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let read = |name: &str| {
            let path = root.join("workloads").join(format!("{name}.toml"));
            crate::workload::WorkloadSource::read(&path).unwrap().parse().unwrap()
        };
        assert!(!needs_eval(&read("stories260k-cpu-f32")));
        for gated in ["stories260k-cpu-f32-kv-bf16", "stories260k-cpu-bf16", "stories260k-cpu-int8"] {
            assert!(needs_eval(&read(gated)), "{gated}");
        }
        let options =
            crate::init::InitOptions { kv_cache: KvDtype::Bf16, ..crate::init::InitOptions::for_tests("kv") };
        let bar = options.quality(false).expect("a bar for a bf16 KV cache");
        assert_eq!((bar.max_mean_kl, bar.min_top1), (Some(1e-3), Some(0.98)));
    }

    #[test]
    fn records_round_trip_through_toml() {
        let record = EvalRecord {
            crate_sha256: "a".into(),
            text_sha256: "b".into(),
            text: "default".into(),
            weights_sha256: "c".into(),
            model: "m".into(),
            monogen: "0.1.0".into(),
            measured_at: "2026-12-06T21:00:00Z".into(),
            figures: Figures::Decoder {
                positions: 3,
                top1: 1.0,
                mean_kl: 1.5e-5,
                p99_kl: 2e-5,
                perplexity: 3.0,
                perplexity_f32: 3.0,
            },
        };
        let text = toml::to_string(&QualityFile { eval: vec![record.clone()] }).unwrap();
        let back: QualityFile = toml::from_str(&text).unwrap();
        assert_eq!(back.eval, vec![record], "{text}");
    }
}
