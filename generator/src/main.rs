//! The `monogen` command line: a thin layer over the library.
//!
//! Exit codes: 0 success; 1 `check` found crates that are out of date; 2 an error (bad
//! arguments, a bad workload, a refused write).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use monogen::emit::LOCK_FILE;
use monogen::init::{CpuFeatures, InitOptions};
use monogen::plan::{Plan, Verdict, human_bytes};
use monogen::workload::Dtype;
use monogen::{Error, Project, check, init, write};

#[derive(Parser)]
#[command(
    name = "monogen",
    version,
    about = "Generates monomorphized inference crates from workload signatures"
)]
struct Cli {
    /// The monogen repository (interfaces/, implementations/, templates/); found from the
    /// current directory when omitted.
    #[arg(long, global = true, value_name = "DIR", env = "MONOGEN_ROOT")]
    root: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a workload signature from a Hugging Face model directory's config.json.
    Init {
        /// Hugging Face model directory (config.json is enough).
        #[arg(long, value_name = "DIR")]
        hf: PathBuf,
        /// Name of the workload and of the crate it generates.
        #[arg(long)]
        name: String,
        /// Where to write the workload; standard output when omitted.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Weight dtype: f32 (bf16, f16 and int8 are planned).
        #[arg(long, default_value = "f32", value_parser = parse_dtype)]
        dtype: Dtype,
        /// Worker threads (default: this machine's cores).
        #[arg(long)]
        threads: Option<usize>,
        /// CPU features the code may use: native (this machine's), none, x86-64-v2/v3/v4, or a comma-separated list.
        #[arg(long, default_value = "native", value_name = "SPEC")]
        cpu_features: String,
        /// Longest sequence (default: the model's max positions, at most 4096).
        #[arg(long, value_name = "N")]
        max_seq_len: Option<usize>,
        /// Typical prompt length (default: min(128, max_seq_len / 2)).
        #[arg(long, value_name = "N")]
        prompt_len: Option<usize>,
        /// Typical number of generated tokens (default: min(128, the rest of max_seq_len)).
        #[arg(long, value_name = "N")]
        decode_len: Option<usize>,
        /// Overwrite FILE if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Show, per interface, every candidate and why it was chosen or rejected, and the memory footprint.
    Explain {
        workload: PathBuf,
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Generate the crate for each workload (default: generated/<name>/).
    Build {
        #[arg(required = true)]
        workloads: Vec<PathBuf>,
        /// Output directory (only with one workload).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Overwrite hand-edited files, and write into a directory monogen did not generate.
        #[arg(long)]
        force: bool,
    },
    /// Exit 0 if every committed crate is what `build` would write now, 1 if not (saying why), 2 on errors.
    Check {
        workloads: Vec<PathBuf>,
        /// Check every workload in workloads/ and look for crates without one.
        #[arg(long)]
        all: bool,
    },
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    match s {
        "f32" => Ok(Dtype::F32),
        "bf16" => Ok(Dtype::Bf16),
        "f16" => Ok(Dtype::F16),
        "int8" => Ok(Dtype::Int8),
        other => Err(format!("unknown dtype `{other}`; use f32, bf16, f16 or int8")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}", e.render(std::io::stderr().is_terminal()));
            ExitCode::from(2)
        }
    }
}

fn project(root: Option<PathBuf>) -> Result<Project, Error> {
    Project::load(&find_root(root)?)
}

fn find_root(root: Option<PathBuf>) -> Result<PathBuf, Error> {
    Ok(match root {
        Some(root) => root,
        None => {
            let cwd = std::env::current_dir().map_err(|e| Error::io(Path::new("."), e))?;
            Project::discover(&cwd).ok_or_else(|| {
                Error::Refused(format!(
                    "no monogen repository (a folder with interfaces/, implementations/ and templates/) at or above {}; run monogen inside one or pass --root",
                    cwd.display()
                ))
            })?
        }
    })
}

fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Init {
            hf,
            name,
            output,
            dtype,
            threads,
            cpu_features,
            max_seq_len,
            prompt_len,
            decode_len,
            force,
        } => {
            let templates = monogen::emit::Templates::load(&find_root(cli.root)?)?;
            if !monogen::workload::is_crate_name(&name) {
                return Err(Error::Refused(format!(
                    "--name `{name}` cannot name a crate: use lowercase letters, digits, `-` and `_`, starting with a letter"
                )));
            }
            let cpu_features = CpuFeatures::parse(&cpu_features).map_err(Error::Refused)?;
            let opts = InitOptions {
                name,
                dtype,
                threads,
                cpu_features,
                max_seq_len,
                typical_prompt_len: prompt_len,
                typical_decode_len: decode_len,
            };
            let workload = init::workload_from_hf(&hf, &opts)?;
            let text = init::render(&workload, &templates, &hf)?;
            let label = output.clone().unwrap_or_else(|| PathBuf::from("<standard output>"));
            monogen::workload::WorkloadSource::from_text(&label, &text).parse().map_err(|mut ds| {
                for d in &mut ds {
                    d.notes.push(format!("the workload was written from {}/config.json", hf.display()));
                }
                Error::Diagnostics(ds)
            })?;
            match output {
                None => print!("{text}"),
                Some(path) => {
                    if path.exists() && !force {
                        return Err(Error::Refused(format!(
                            "{} exists; pass --force to overwrite it",
                            path.display()
                        )));
                    }
                    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
                    }
                    std::fs::write(&path, &text).map_err(|e| Error::io(&path, e))?;
                    eprintln!("wrote {}", path.display());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain { workload, json } => {
            let project = project(cli.root)?;
            let w = project.read_workload(&workload)?;
            let plan = project.plan(&w, &workload)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&plan).expect("a plan always serializes"));
            } else {
                print!("{}", explain(&plan, &workload, &project.default_out_dir(&w)));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Build { workloads, out, force } => {
            if out.is_some() && workloads.len() > 1 {
                return Err(Error::Refused("--out takes one workload; build the others separately".into()));
            }
            let project = project(cli.root)?;
            for path in &workloads {
                let (plan, output) = project.generate(path)?;
                let dir = out.clone().unwrap_or_else(|| project.default_out_dir(&plan.workload));
                let report = write::write(&dir, &output, force)?;
                if report.changed() {
                    eprintln!(
                        "built {}: {} created, {} updated, {} removed, {} unchanged",
                        shown(&dir),
                        report.created.len(),
                        report.updated.len(),
                        report.removed.len(),
                        report.unchanged
                    );
                } else {
                    eprintln!("{} is up to date", shown(&dir));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { workloads, all } => {
            let project = project(cli.root)?;
            let mut paths = workloads;
            if all {
                paths.extend(project.workloads()?);
            }
            if paths.is_empty() {
                return Err(Error::Refused("name the workloads to check, or pass --all".into()));
            }
            let mut seen = std::collections::BTreeSet::new();
            paths.retain(|p| seen.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())));
            let mut stale = 0;
            let mut names: Vec<String> = Vec::new();
            for path in &paths {
                let (plan, output) = project.generate(path)?;
                let dir = project.default_out_dir(&plan.workload);
                if names.contains(&plan.workload.name) {
                    return Err(Error::Refused(format!(
                        "two workloads are named `{}` (the second is {}); each crate needs its own name",
                        plan.workload.name,
                        shown(path)
                    )));
                }
                names.push(plan.workload.name.clone());
                let diff = write::diff(&dir, &output)?;
                if diff.is_clean() {
                    println!("ok      {} ({})", shown(&dir), shown(path));
                    continue;
                }
                stale += 1;
                println!("STALE   {} ({})", shown(&dir), shown(path));
                let old_lock = std::fs::read_to_string(dir.join(LOCK_FILE)).ok();
                for reason in check::reasons(old_lock.as_deref(), &plan, &project.registry, &diff) {
                    println!("        because {reason}");
                }
                for (what, files) in
                    [("missing", &diff.missing), ("differs", &diff.modified), ("stale", &diff.stale)]
                {
                    for f in files {
                        let edited = if diff.hand_edited.contains(f) { " (edited by hand)" } else { "" };
                        println!("        {what}: {}{edited}", f.display());
                    }
                }
                println!("        fix: monogen build {}", shown(path));
            }
            if all {
                let generated = project.root.join("generated");
                if let Ok(entries) = std::fs::read_dir(&generated) {
                    let mut orphans: Vec<String> = entries
                        .flatten()
                        .filter(|e| e.path().join(LOCK_FILE).exists())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| !names.contains(n))
                        .collect();
                    orphans.sort();
                    for orphan in orphans {
                        stale += 1;
                        println!("ORPHAN  {} has no workload in workloads/", shown(&generated.join(&orphan)));
                        println!("        fix: delete it, or add workloads/{orphan}.toml");
                    }
                }
            }
            Ok(if stale == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
    }
}

/// `path` relative to the current directory when it is below it (shorter messages).
fn shown(path: &Path) -> String {
    let cwd = std::env::current_dir().ok().and_then(|d| std::fs::canonicalize(d).ok());
    let full = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    match cwd.as_deref().and_then(|cwd| full.strip_prefix(cwd).ok()) {
        Some(relative) if !relative.as_os_str().is_empty() => relative.display().to_string(),
        _ => path.display().to_string(),
    }
}

/// The text form of `monogen explain`.
fn explain(plan: &Plan, path: &Path, out_dir: &Path) -> String {
    let w = &plan.workload;
    let c = &plan.consts;
    let mut s = String::new();
    s.push_str(&format!("workload {} ({})\n", w.name, path.display()));
    s.push_str(&format!(
        "  model:   {} with {} layers, hidden {}, mlp {}, {} heads / {} kv heads of {}, vocab {}, {} embeddings\n",
        w.model.architecture().as_str(),
        c.n_layers,
        c.dim,
        c.hidden_dim,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.vocab_size,
        if c.tie_word_embeddings { "tied" } else { "untied" }
    ));
    s.push_str(&format!(
        "  target:  {} {} [{}], {} thread{}, {} weights\n",
        w.target.device.as_str(),
        w.target.arch,
        w.target.cpu_features.join(", "),
        w.target.threads,
        if w.target.threads == 1 { "" } else { "s" },
        w.weights.dtype.as_str()
    ));
    s.push_str(&format!(
        "  request: batch {}, up to {} positions (typical prompt {}, decode {})\n",
        w.request.max_batch,
        w.request.max_seq_len,
        w.request.typical_prompt_len,
        w.request.typical_decode_len
    ));
    for i in &plan.interfaces {
        s.push_str(&format!("\n{}: {}\n", i.interface, i.summary));
        for cand in &i.candidates {
            let head = format!("  {} {} (priority {})", cand.name, cand.version, cand.priority);
            let line = match &cand.verdict {
                Verdict::Chosen { reason } => format!("{head}: CHOSEN, {reason}"),
                Verdict::Outranked { reason, .. } => format!("{head}: compatible, not chosen: {reason}"),
                Verdict::Shadowed { by } => {
                    format!("{head}: compatible, replaced by {by} (which shadows it)")
                }
                Verdict::Rejected { reasons } => format!("{head}: rejected: {}", reasons.join("; ")),
            };
            s.push_str(&line);
            s.push('\n');
        }
    }
    let f = &plan.footprint;
    s.push_str(&format!(
        "\nstart-up check: {}\n",
        if plan.cpu_features.is_empty() {
            "none (no kernel needs a CPU feature)".to_string()
        } else {
            plan.cpu_features.join(", ")
        }
    ));
    s.push_str(&format!(
        "memory: weights {} ({} parameters, {}, memory-mapped); per session: KV cache {}, activations {}\n",
        human_bytes(f.weight_bytes),
        f.parameters,
        w.weights.dtype.as_str(),
        human_bytes(f.kv_cache_bytes),
        human_bytes(f.scratch_bytes)
    ));
    s.push_str(&format!("output: {}\n", shown(out_dir)));
    s
}
