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
use monogen::plan::{Consts, Plan, Verdict, human_bytes, human_ns};
use monogen::rankings::Evidence;
use monogen::workload::{Activations, Dtype, KvDtype, Request};
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
        /// Weight dtype: f32, bf16, or int8 (blockwise, quantized at load); f16 is planned.
        #[arg(long, default_value = "f32", value_parser = parse_dtype)]
        dtype: Dtype,
        /// What the linear layers' products read their activations as: f32, or bf16 (rounded; needs --dtype bf16), one term per activation on AMX tiles.
        #[arg(long, default_value = "f32", value_parser = parse_activations, value_name = "DTYPE")]
        activations: Activations,
        /// KV cache element type (decoders): f32, or bf16, which halves what attention reads per step.
        #[arg(long, default_value = "f32", value_parser = parse_kv_dtype, value_name = "DTYPE")]
        kv_cache: KvDtype,
        /// Worker threads (default: this machine's cores).
        #[arg(long)]
        threads: Option<usize>,
        /// CPU features the code may use: native (this machine's), none, x86-64-v2/v3/v4, or a comma-separated list.
        #[arg(long, default_value = "native", value_name = "SPEC")]
        cpu_features: String,
        /// Longest sequence (default: the model's max positions, at most 4096).
        #[arg(long, value_name = "N")]
        max_seq_len: Option<usize>,
        /// Typical prompt length (default: min(128, max_seq_len / 2)); for encoders, the typical
        /// sentence length in tokens (default 12).
        #[arg(long, value_name = "N")]
        prompt_len: Option<usize>,
        /// Typical number of generated tokens (default: min(128, the rest of max_seq_len)).
        #[arg(long, value_name = "N")]
        decode_len: Option<usize>,
        /// Encoders: most sentences per call (default 32).
        #[arg(long, value_name = "N")]
        max_batch: Option<usize>,
        /// Requests a process serves per load of the model from its checkpoint, if the load
        /// should count in the choice of kernels (1: a process per request); default: not counted.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        requests_per_load: Option<u64>,
        /// Hardware class whose measurements (rankings/<CLASS>/) choose the kernels: `this`
        /// (this machine's), `none` (declared priority only), or a class name.
        #[arg(long, default_value = "this", value_name = "CLASS")]
        hardware: String,
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
    /// Measure every competing implementation of each workload on this machine and record the
    /// results in rankings/<hardware class>/.
    Bench {
        #[arg(required = true)]
        workloads: Vec<PathBuf>,
        /// Print the results as one JSON document.
        #[arg(long)]
        json: bool,
        /// Timed rounds per candidate.
        #[arg(long, default_value_t = 21, value_parser = clap::value_parser!(u64).range(3..=10_000))]
        samples: u64,
        /// Untimed rounds first.
        #[arg(long, default_value_t = 3)]
        warm_up: u64,
        /// Each timing repeats a pass for at least this long (microseconds).
        #[arg(long, default_value_t = 2000, value_name = "US")]
        min_sample_us: u64,
        /// Measure and report, but do not write rankings/.
        #[arg(long)]
        dry_run: bool,
        /// Measure only this interface of each workload (repeat it, or separate names with
        /// commas); the records of its other interfaces stay as they are. `monogen affected`
        /// names the interfaces a change needs measured again.
        #[arg(long = "interface", value_name = "NAME", value_delimiter = ',')]
        interfaces: Vec<String>,
    },
    /// Write a model directory (config.json, random model.safetensors, tokenizer.json) with a
    /// workload's shapes, for benchmarks.
    SynthWeights {
        workload: PathBuf,
        /// The directory to write (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// List the workloads to regenerate and the benchmarks to re-run after the changes since REV.
    Affected {
        /// The git revision to compare with (e.g. origin/main).
        #[arg(long, value_name = "REV")]
        base: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
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

fn parse_activations(s: &str) -> Result<Activations, String> {
    match s {
        "f32" => Ok(Activations::F32),
        "bf16" => Ok(Activations::Bf16),
        other => Err(format!("unknown activations dtype `{other}`; use f32 or bf16")),
    }
}

fn parse_kv_dtype(s: &str) -> Result<KvDtype, String> {
    match s {
        "f32" => Ok(KvDtype::F32),
        "bf16" => Ok(KvDtype::Bf16),
        other => Err(format!("unknown KV cache dtype `{other}`; use f32 or bf16")),
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
            activations,
            kv_cache,
            threads,
            cpu_features,
            max_seq_len,
            prompt_len,
            decode_len,
            max_batch,
            requests_per_load,
            hardware,
            force,
        } => {
            let hardware = match hardware.as_str() {
                "this" => Some(monogen::host::this_class()),
                "none" => None,
                class if monogen::workload::is_hardware_class(class) => Some(class.to_string()),
                class => {
                    return Err(Error::Refused(format!(
                        "--hardware `{class}` cannot name a hardware class: use lowercase letters, digits and `-`"
                    )));
                }
            };
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
                activations,
                kv_cache,
                threads,
                cpu_features,
                max_seq_len,
                typical_prompt_len: prompt_len,
                typical_decode_len: decode_len,
                hardware,
                max_batch,
                requests_per_load,
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
                let (plan, output) = project.generate_into(path, out.as_deref())?;
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
        Command::Bench { workloads, json, samples, warm_up, min_sample_us, dry_run, interfaces } => {
            let mut project = project(cli.root)?;
            let timing = monogen::bench::Timing {
                samples: samples as usize,
                warm_up: warm_up as usize,
                min_sample_us,
            };
            let mut reports = Vec::new();
            for path in &workloads {
                reports.push(bench_one(&mut project, path, &timing, &interfaces, json, dry_run)?);
            }
            if json {
                let doc = if reports.len() == 1 {
                    reports.pop().expect("one report")
                } else {
                    serde_json::Value::Array(reports)
                };
                println!("{}", serde_json::to_string_pretty(&doc).expect("reports serialize"));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::SynthWeights { workload, out, seed } => {
            let project = project(cli.root)?;
            let w = project.read_workload(&workload)?;
            let parameters = monogen::synth::write_model_dir(&w, &out, seed)?;
            let (dtype, bytes) = match w.weights.dtype {
                // Int8 crates quantize a bfloat16 checkpoint at load.
                monogen::workload::Dtype::Int8 => ("bf16", 2),
                other => (other.as_str(), other.size() as u64),
            };
            eprintln!(
                "wrote {}: config.json, tokenizer.json and model.safetensors ({parameters} random {dtype} parameters, {})",
                shown(&out),
                human_bytes(parameters * bytes)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Affected { base, json } => {
            let project = project(cli.root)?;
            let changed = monogen::affected::changed_files(&project.root, &base)?;
            let result = monogen::affected::affected(&project, &changed)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&result).expect("results serialize"));
            } else {
                print!("{}", result.render(&base));
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
                let unmeasured: Vec<&String> = plan.interfaces.iter().flat_map(|i| &i.unmeasured).collect();
                if diff.is_clean() && unmeasured.is_empty() {
                    println!("ok      {} ({})", shown(&dir), shown(path));
                    continue;
                }
                stale += 1;
                println!("STALE   {} ({})", shown(&dir), shown(path));
                if !diff.is_clean() {
                    let old_lock = std::fs::read_to_string(dir.join(LOCK_FILE)).ok();
                    for reason in check::reasons(old_lock.as_deref(), &plan, &project.registry, &diff) {
                        println!("        because {reason}");
                    }
                }
                for note in &unmeasured {
                    println!("        because {note}");
                }
                for (what, files) in
                    [("missing", &diff.missing), ("differs", &diff.modified), ("stale", &diff.stale)]
                {
                    for f in files {
                        let edited = if diff.hand_edited.contains(f) { " (edited by hand)" } else { "" };
                        println!("        {what}: {}{edited}", f.display());
                    }
                }
                if unmeasured.is_empty() {
                    println!("        fix: monogen build {}", shown(path));
                } else {
                    println!(
                        "        fix: monogen bench {0} (on hardware class {1}), then monogen build {0}",
                        shown(path),
                        plan.workload.target.hardware.as_deref().unwrap_or_default()
                    );
                }
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

/// `monogen bench` for one workload: returns its JSON report (printed by the caller with
/// --json) and prints the human one otherwise.
fn bench_one(
    project: &mut Project,
    path: &Path,
    timing: &monogen::bench::Timing,
    only: &[String],
    json: bool,
    dry_run: bool,
) -> Result<serde_json::Value, Error> {
    use monogen::bench;
    use monogen::rankings;

    let w = project.read_workload(path)?;
    let mut plan = project.plan(&w, path)?;
    let required = monogen::resolve::required_interfaces(&w);
    if let Some(unknown) = only.iter().find(|name| !required.contains(&name.as_str())) {
        return Err(Error::Refused(format!(
            "`{unknown}` is not an interface of {}: it calls {}",
            shown(path),
            required.join(", ")
        )));
    }
    // The interfaces to measure, and the harness that measures them (and no others).
    let measured: Vec<&str> =
        required.iter().copied().filter(|i| only.is_empty() || only.iter().any(|o| o == i)).collect();
    plan.interfaces.retain(|i| measured.contains(&i.interface.as_str()));
    let host = monogen::host::Host::detect().map_err(Error::Refused)?;
    let Some(class) = w.target.hardware.clone() else {
        return Err(Error::Refused(format!(
            "{} names no hardware class, so its measurements would choose nothing; add `hardware = \"{}\"` (this machine) to its [target]",
            shown(path),
            host.class
        )));
    };
    if class != host.class {
        return Err(Error::Refused(format!(
            "{} is tuned for hardware class `{class}`, but this machine is `{}`: run `monogen bench` on a `{class}` machine, or set target.hardware = \"{}\"",
            shown(path),
            host.class,
            host.class
        )));
    }
    let dir = bench::bench_dir(project);
    let bar = progress_bar(json);
    bar.set_message(format!("{}: compiling the benchmark harness", w.name));
    let (crate_dir, crate_name) = bench::write_harness(&*project, &plan, &dir)?;
    let exe = bench::build_harness(&crate_dir, &bench::bench_target_dir(project), &crate_name)?;
    bar.set_message(format!("{}: validating", w.name));
    let raw = bench::run_harness(&exe, timing, |event| match event {
        bench::Event::Begin { rounds, .. } => {
            bar.set_length(*rounds as u64);
            bar.set_position(0);
        }
        bench::Event::Round { interface } => {
            bar.set_message(format!("{}: {interface}", w.name));
            bar.inc(1);
        }
        bench::Event::Result(_) => {}
    })?;
    bar.finish_and_clear();

    let outcomes: Vec<bench::Outcome> = raw
        .iter()
        .map(|r| {
            let version = project
                .registry
                .implementation(&r.interface, &r.implementation)
                .map_or_else(String::new, |i| i.version.clone());
            bench::summarize(r, &version)
        })
        .collect();
    let measured_at = bench::now_utc();
    let records = bench::records(&outcomes, &plan, &project.registry, &host, &measured_at);
    let shapes = rankings::shapes_signature(&w);
    let mut updated = project.rankings.clone();
    for &interface in &measured {
        updated.replace(&class, interface, &shapes, records.get(interface).cloned().unwrap_or_default());
    }
    let mut written = Vec::new();
    if !dry_run {
        for &interface in &measured {
            let (rel, text) = updated.render(&class, interface);
            let file = project.root.join(&rel);
            if std::fs::read_to_string(&file).is_ok_and(|old| old == text) {
                continue;
            }
            write_atomically(&file, &text)?;
            written.push(rel.display().to_string());
        }
    }
    // What `build` will choose now, against what the crate holds.
    let new_plan = if dry_run {
        Project { rankings: updated, ..project.clone() }.plan(&w, path)?
    } else {
        project.rankings = updated;
        project.plan(&w, path)?
    };
    finish_bench(
        project,
        path,
        &w,
        &host,
        &class,
        &shapes,
        &measured_at,
        outcomes,
        written,
        new_plan,
        json,
        dry_run,
    )
}

/// The report of one `bench` run: what was measured and what `build` will now choose.
#[allow(clippy::too_many_arguments)]
fn finish_bench(
    project: &Project,
    path: &Path,
    w: &monogen::workload::Workload,
    host: &monogen::host::Host,
    class: &str,
    shapes: &str,
    measured_at: &str,
    outcomes: Vec<monogen::bench::Outcome>,
    written: Vec<String>,
    new_plan: Plan,
    json: bool,
    dry_run: bool,
) -> Result<serde_json::Value, Error> {
    use monogen::bench;
    use monogen::rankings;
    let locked = monogen::check::locked_choices(&project.default_out_dir(w));
    let changes: Vec<serde_json::Value> = new_plan
        .interfaces
        .iter()
        .filter_map(|i| {
            let old = locked.get(&i.interface)?;
            (old != &i.chosen.name).then(|| {
                serde_json::json!({ "interface": i.interface, "from": old, "to": i.chosen.name, "reason": i.chosen.reason })
            })
        })
        .collect();

    if !json {
        println!("{} on {} ({}, {} cores, {})", w.name, class, host.cpu, host.cores, host.rustc);
        match &w.request {
            Request::Decoder(r) => println!(
                "  time per typical request: one prefill of {} tokens and {} decode steps",
                r.typical_prompt_len.min(r.max_seq_len),
                r.typical_decode_len
            ),
            Request::Encoder(r) => println!(
                "  time per typical request: one call on {} sentence(s) of {} tokens",
                r.typical_batch, r.typical_seq_len
            ),
        }
        // The interfaces measured (all of them, unless `--interface` named some).
        for i in new_plan.interfaces.iter().filter(|i| outcomes.iter().any(|o| o.interface == i.interface)) {
            println!("\n{}", i.interface);
            let mut mine: Vec<&bench::Outcome> =
                outcomes.iter().filter(|o| o.interface == i.interface).collect();
            let median = |o: &bench::Outcome| match o.result {
                bench::Measured::Ok { median_ns, .. } => median_ns,
                _ => f64::INFINITY,
            };
            // By time per request, with the share of the load where the workload counts it.
            let charged = |o: &bench::Outcome| match (&o.result, w.request.requests_per_load()) {
                (bench::Measured::Ok { median_ns, load_ns: Some(load), .. }, Some(n)) => {
                    median_ns + load / n as f64
                }
                _ => median(o),
            };
            mine.sort_by(|a, b| charged(a).total_cmp(&charged(b)));
            let reference = &project.registry.interfaces[&i.interface].reference;
            let reference_median = mine.iter().find(|o| &o.implementation == reference).map(|o| median(o));
            for o in mine {
                let mark = if o.implementation == i.chosen.name { "*" } else { " " };
                let line = match &o.result {
                    bench::Measured::Ok { median_ns, p90_ns, samples, load_ns, load_max_ns, .. } => {
                        let ratio = reference_median
                            .filter(|r| r.is_finite() && &o.implementation != reference)
                            .map(|r| format!(", {:.2}x the reference's speed", r / median_ns))
                            .unwrap_or_default();
                        let counted = match w.request.requests_per_load() {
                            Some(n) => {
                                format!(", {} a request counted", human_ns(load_ns.unwrap_or(0.0) / n as f64))
                            }
                            None => ", not counted".to_string(),
                        };
                        let load = load_ns
                            .map(|ns| {
                                format!(
                                    "; packing at load {}{}{counted}",
                                    human_ns(ns),
                                    slowest(*load_max_ns)
                                )
                            })
                            .unwrap_or_default();
                        format!(
                            "{:>12}  p90 {:>12}  ({samples} samples{ratio}{load})",
                            human_ns(*median_ns),
                            human_ns(*p90_ns)
                        )
                    }
                    bench::Measured::Failed { reason } => format!("FAILED against the reference: {reason}"),
                    bench::Measured::Skipped { reason } => format!("skipped: {reason}"),
                };
                println!(" {mark} {:<20} {line}", o.implementation);
            }
        }
        println!();
        if dry_run {
            println!("dry run: rankings/ left unchanged");
        } else if written.is_empty() {
            println!("rankings/{class}/ unchanged");
        } else {
            println!("wrote {}", written.join(", "));
        }
        if changes.is_empty() {
            println!("no choice of {} changes (* marks the choices)", w.name);
        } else {
            for c in &changes {
                println!(
                    "{}: {} → {} ({})",
                    c["interface"].as_str().unwrap_or_default(),
                    c["from"].as_str().unwrap_or_default(),
                    c["to"].as_str().unwrap_or_default(),
                    c["reason"].as_str().unwrap_or_default()
                );
            }
            println!("run `monogen build {}` to regenerate the crate", shown(path));
        }
    }
    Ok(serde_json::json!({
        "workload": w.name,
        "hardware": host,
        "shapes": shapes,
        "build_flags": rankings::BUILD_FLAGS,
        "measured_at": measured_at,
        "results": outcomes,
        "rankings_written": written,
        "choices_changed": changes,
    }))
}

fn progress_bar(hidden: bool) -> indicatif::ProgressBar {
    if hidden || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(1);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} rounds  {msg}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

fn write_atomically(path: &Path, text: &str) -> Result<(), Error> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
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

/// ` (slowest X)`: a packing's time with each matrix's slowest of its three packings, where the
/// record has it.
fn slowest(load_max_ns: Option<f64>) -> String {
    load_max_ns.map(|ns| format!(" (slowest {})", human_ns(ns))).unwrap_or_default()
}

/// The evidence of one candidate, for `explain`.
fn evidence_line(evidence: &Evidence) -> Option<String> {
    let measured = |r: &monogen::rankings::Record| {
        let slowest = slowest(r.load_max_ns.map(|ns| ns as f64));
        let load = match (r.load_ns, r.load_counted_ns) {
            // Counted or not, the workload's `request:` line says; a stale record is never counted.
            (Some(load), 0) => format!("; packing at load {}{slowest}", human_ns(load as f64)),
            (Some(load), share) => {
                format!(
                    "; packing at load {}{slowest}, {} of it counted per request",
                    human_ns(load as f64),
                    human_ns(share as f64)
                )
            }
            (None, _) => String::new(),
        };
        format!(
            "{} per request (p90 {}, {} samples; prefill pass {}, decode step {}{load}), measured {} with {}",
            human_ns(r.median_ns as f64),
            human_ns(r.p90_ns as f64),
            r.samples,
            human_ns(r.prefill_median_ns as f64),
            human_ns(r.decode_median_ns as f64),
            r.measured_at,
            r.rustc
        )
    };
    match evidence {
        Evidence::NoHardwareClass => None,
        Evidence::Measured(r) => Some(format!("evidence: {}", measured(r))),
        Evidence::Failed(r) => Some(format!("evidence: failed validation, measured {}", r.measured_at)),
        Evidence::Stale { record, why } => {
            Some(format!("evidence: STALE ({}); was {}", why.join("; "), measured(record)))
        }
        Evidence::Missing => None,
    }
}

/// The text form of `monogen explain`.
fn explain(plan: &Plan, path: &Path, out_dir: &Path) -> String {
    let w = &plan.workload;
    let mut s = String::new();
    s.push_str(&format!("workload {} ({})\n", w.name, path.display()));
    let model = match &plan.consts {
        Consts::Llama(c) => format!(
            "llama with {} layers, hidden {}, mlp {}, {} heads / {} kv heads of {}, vocab {}, {} embeddings",
            c.n_layers,
            c.dim,
            c.hidden_dim,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.vocab_size,
            if c.tie_word_embeddings { "tied" } else { "untied" }
        ),
        Consts::Bert(c) => format!(
            "bert with {} layers, hidden {}, mlp {}, {} heads of {}, vocab {}, {} positions, {} pooling{}",
            c.n_layers,
            c.dim,
            c.hidden_dim,
            c.n_heads,
            c.head_dim,
            c.vocab_size,
            c.max_positions,
            c.pooling.as_str(),
            if c.normalize { ", L2-normalized" } else { "" }
        ),
    };
    s.push_str(&format!("  model:   {model}\n"));
    s.push_str(&format!(
        "  target:  {} {} [{}], {} thread{}, {} weights, hardware class {}\n",
        w.target.device.as_str(),
        w.target.arch,
        w.target.cpu_features.join(", "),
        w.target.threads,
        if w.target.threads == 1 { "" } else { "s" },
        w.weights.dtype.as_str(),
        w.target.hardware.as_deref().unwrap_or("none (kernels chosen by declared priority)")
    ));
    let request = match &w.request {
        Request::Decoder(r) => format!(
            "batch {}, up to {} positions (typical prompt {}, decode {})",
            r.max_batch, r.max_seq_len, r.typical_prompt_len, r.typical_decode_len
        ),
        Request::Encoder(r) => format!(
            "up to {} sentences of up to {} tokens (typical {} of {})",
            r.max_batch, r.max_seq_len, r.typical_batch, r.typical_seq_len
        ),
    };
    let load = match w.request.requests_per_load() {
        Some(1) => "; each request loads the model (packing at load counted in full)".to_string(),
        Some(n) => format!("; {n} requests per load of the model (packing at load counted, shared by them)"),
        None => String::new(),
    };
    s.push_str(&format!("  request: {request}{load}\n"));
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
                Verdict::Failed { failure } => {
                    format!("{head}: FAILED against the reference when measured, never chosen: {failure}")
                }
                Verdict::Rejected { reasons } => format!("{head}: rejected: {}", reasons.join("; ")),
            };
            s.push_str(&line);
            s.push('\n');
            if let Some(evidence) = &cand.evidence
                && let Some(text) = evidence_line(evidence)
            {
                s.push_str(&format!("      {text}\n"));
            }
        }
        for note in &i.unmeasured {
            s.push_str(&format!("  ! {note}\n"));
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
    let per_run = match &plan.consts {
        Consts::Llama(_) => format!(
            "per session: KV cache {} ({}), activations {}",
            human_bytes(f.kv_cache_bytes),
            w.kv_cache.dtype.as_str(),
            human_bytes(f.scratch_bytes)
        ),
        Consts::Bert(_) => {
            format!("per encoder: activations {} (a full batch)", human_bytes(f.scratch_bytes))
        }
    };
    s.push_str(&format!(
        "memory: weights {} ({} parameters, {}, memory-mapped); {per_run}\n",
        human_bytes(f.weight_bytes),
        f.parameters,
        w.weights.dtype.as_str(),
    ));
    s.push_str(&format!("output: {}\n", shown(out_dir)));
    s
}
