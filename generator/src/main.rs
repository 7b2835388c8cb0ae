//! The `monogen` command line: a thin layer over the library.
//!
//! Exit codes: 0 success; 1 `check` found crates that are out of date; 2 an error (bad
//! arguments, a bad workload, a refused write).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use monogen::bench::Progress;
use monogen::init::{CpuFeatures, InitOptions};
use monogen::plan::human_bytes;
use monogen::workload::{Activations, Dtype, KvDtype};
use monogen::{Error, Project, check, init, shown, write};

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
    /// The ranking database (default: rankings/ of the monogen repository): a deployment
    /// repository keeps the measurements of its own hardware here.
    #[arg(long, global = true, value_name = "DIR", env = "MONOGEN_RANKINGS")]
    rankings: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a workload signature from a Hugging Face model directory's config.json.
    Init(InitArgs),
    /// Show, per interface, every candidate and why it was chosen or rejected, and the memory footprint.
    Explain {
        /// The workload file (TOML).
        #[arg(required_unless_present = "krate", conflicts_with = "krate")]
        workload: Option<PathBuf>,
        /// Where the crate is (default: generated/<name>/): its monogen.lock holds the
        /// incumbent choices.
        #[arg(long, value_name = "DIR", conflicts_with = "krate")]
        out: Option<PathBuf>,
        /// A crate monogen generated, anywhere: explain its own workload.toml, with its
        /// monogen.lock's choices as the incumbents.
        #[arg(long = "crate", id = "krate", value_name = "DIR")]
        krate: Option<PathBuf>,
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Generate the crate for each workload (default: generated/<name>/).
    Build {
        /// The workload files (TOML) to generate crates for.
        #[arg(required_unless_present = "crates", value_name = "WORKLOAD")]
        workloads: Vec<PathBuf>,
        /// Output directory (only with one workload).
        #[arg(long, value_name = "DIR", conflicts_with = "crates")]
        out: Option<PathBuf>,
        /// Regenerate a crate monogen generated, anywhere, in place from its own workload.toml
        /// (repeat it for several crates).
        #[arg(long = "crate", id = "crates", value_name = "DIR", num_args = 1..)]
        crates: Vec<PathBuf>,
        /// Overwrite hand-edited files, and write into a directory monogen did not generate.
        #[arg(long)]
        force: bool,
    },
    /// Measure every competing implementation of each workload on this machine and record the
    /// results in rankings/<this machine's hardware class>/.
    Bench {
        /// The workload files (TOML) whose kernels to measure.
        #[arg(required_unless_present = "crates", value_name = "WORKLOAD")]
        workloads: Vec<PathBuf>,
        /// Crates monogen generated, anywhere: measure for their own workload.toml.
        #[arg(long = "crate", id = "crates", value_name = "DIR", num_args = 1..)]
        crates: Vec<PathBuf>,
        /// Measure only the interfaces whose records `check` finds missing or stale (on this
        /// machine's class); a workload with none is skipped.
        #[arg(long)]
        stale: bool,
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
        /// Adopt a flip on the kernels' records alone: skip building the crate both ways and
        /// timing it end to end, which `bench` otherwise does for each choice it changes.
        #[arg(long)]
        no_confirm: bool,
        /// Measure no kernel: check each measured choice of the crate (of the interfaces named
        /// by --interface, or all) against its runner-up by the kernels' records end to end (the
        /// crate built with each, timed as a flip's check is). A runner-up that the crate runs
        /// faster becomes the choice, and `explain` says so.
        #[arg(long, conflicts_with_all = ["dry_run", "no_confirm", "stale", "model", "build_only"])]
        verify: bool,
        /// With --verify: time again the choices whose check is on record for the current
        /// sources of the choice and its runner-up at the workload's shapes, which it otherwise
        /// reports without timing them again.
        #[arg(long, requires = "verify")]
        recheck: bool,
        /// Interleaved rounds of that end-to-end check, and of the measurement of speculation.
        #[arg(long, default_value_t = 7, value_name = "N", value_parser = clap::value_parser!(u64).range(3..=1000))]
        confirm_rounds: u64,
        /// The Hugging Face folder of the workload's model (real weights): measure speculation,
        /// for a workload whose [speculation] says `speculator = "measured"`, by decoding its
        /// typical_text with each candidate's crate. `--interface speculator` measures only that.
        #[arg(long, value_name = "DIR", conflicts_with = "build_only")]
        model: Option<PathBuf>,
        /// Only write and compile each workload's benchmark harness and print the path of its
        /// executable; measure nothing (bench/same_harness.sh compares two trees' harnesses).
        #[arg(long, conflicts_with_all = ["dry_run", "json", "interfaces"])]
        build_only: bool,
        /// Measure only this interface of each workload (repeat it, or separate names with
        /// commas); the records of its other interfaces stay as they are. `monogen affected`
        /// names the interfaces a change needs measured again.
        #[arg(long = "interface", value_name = "NAME", value_delimiter = ',')]
        interfaces: Vec<String>,
    },
    /// Measure a workload's crate against its f32 twin on a real model over an evaluation text
    /// (top-1 agreement, KL divergence and perplexity; an encoder's cosine similarity), record
    /// the figures in the ranking database's quality/ and hold them to the workload's
    /// [quality] bar: exit 0 when cleared, 1 when not.
    Eval {
        /// The workload file (TOML).
        #[arg(required_unless_present = "krate", conflicts_with = "krate")]
        workload: Option<PathBuf>,
        /// A crate monogen generated, anywhere: evaluate its own workload.toml, with its
        /// monogen.lock's choices as the incumbents (repeat it with --stale).
        #[arg(long = "crate", id = "krate", value_name = "DIR", num_args = 1..)]
        krate: Vec<PathBuf>,
        /// The model's Hugging Face folder (config.json, model.safetensors, tokenizer.json).
        #[arg(long, value_name = "DIR", required_unless_present = "stale")]
        model: Option<PathBuf>,
        /// With --stale: the folder that holds each crate's model in a folder named as the
        /// crate's own (MODELS/NAME for crates/NAME).
        #[arg(long, value_name = "DIR", requires = "stale", conflicts_with = "model")]
        models: Option<PathBuf>,
        /// Evaluate only those of the crates (--crate) that `check` would ask to: a bf16 or
        /// int8 crate (or one with bf16 activations or KV cache) with a bar and no record of its
        /// current numerics; say why of the others. A deployment repository's regenerate job
        /// runs it after `build --crate`.
        #[arg(long, requires = "krate", requires = "models", conflicts_with_all = ["text", "json"])]
        stale: bool,
        /// The evaluation text (default: the workload's quality.text, else monogen's own):
        /// a decoder reads it whole, an encoder embeds each line.
        #[arg(long, value_name = "FILE")]
        text: Option<PathBuf>,
        /// Print the record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a model directory (config.json, random model.safetensors, tokenizer.json) with a
    /// workload's shapes, for benchmarks.
    SynthWeights {
        /// The workload file (TOML) whose shapes the model takes.
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
        /// The workload files (TOML) whose crates to check.
        workloads: Vec<PathBuf>,
        /// Check every workload in workloads/ and look for crates without one.
        #[arg(long)]
        all: bool,
        /// Where the crate is, when it was built with `build --out` (only with one workload).
        #[arg(long, value_name = "DIR", conflicts_with = "crates")]
        out: Option<PathBuf>,
        /// A crate monogen generated, anywhere (a deployment repository's): check it against
        /// its own workload.toml (repeat it for several crates).
        #[arg(long = "crate", id = "crates", value_name = "DIR", num_args = 1..)]
        crates: Vec<PathBuf>,
    },
}

/// The arguments of `monogen init`.
#[derive(clap::Args)]
struct InitArgs {
    /// Hugging Face model directory (config.json is enough).
    #[arg(long, value_name = "DIR")]
    hf: PathBuf,
    /// Name of the workload and of the crate it generates.
    #[arg(long)]
    name: String,
    /// Where to write the workload; standard output when omitted.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Weight dtype: f32, bf16, int8 or int4 (blockwise, quantized at load); f16 is planned.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: Dtype,
    /// What the linear layers' products read their activations as: f32, or bf16 (rounded; needs --dtype bf16), one term per activation on AMX tiles.
    #[arg(long, default_value = "f32", value_parser = parse_activations, value_name = "DTYPE")]
    activations: Activations,
    /// Decoders: the classifier's weight dtype where it differs from --dtype (the embedding's too
    /// where they are tied), e.g. int8 beside --dtype int4.
    #[arg(long, value_parser = parse_dtype, value_name = "DTYPE")]
    classifier_dtype: Option<Dtype>,
    /// KV cache element type (decoders): f32, or bf16, which halves what attention reads per step.
    #[arg(long, default_value = "f32", value_parser = parse_kv_dtype, value_name = "DTYPE")]
    kv_cache: KvDtype,
    /// Where the model runs: cpu, or cuda (an NVIDIA GPU; needs --cuda-arch).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    device: String,
    /// With --device cuda: the GPU architecture the kernels are compiled for: sm_80 (A100),
    /// sm_86, sm_89, sm_90 (H100, H200).
    #[arg(long, value_name = "ARCH")]
    cuda_arch: Option<String>,
    /// Worker threads (default: this machine's cores; 1 with --device cuda, whose host thread
    /// only launches kernels).
    #[arg(long)]
    threads: Option<usize>,
    /// CPU features the code may use: native (this machine's; none with --device cuda), none, x86-64-v2/v3/v4, or a comma-separated list.
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
    /// Most sequences run at once: sentences per call of an encoder (default 32), sequences per
    /// decode step of a decoder (default 1; 8 with --serve).
    #[arg(long, value_name = "N")]
    max_batch: Option<usize>,
    /// Add a [serving] table, so that the crate's binary gets a `serve` subcommand: an
    /// OpenAI-compatible HTTP server (a decoder's completions, with continuous batching and
    /// priority classes, and chat completions where the model has a chat template; an encoder's
    /// embeddings, batching requests that arrive together).
    #[arg(long)]
    serve: bool,
    /// Decoders: add a [speculation] table, so that generation speculates by prompt lookup
    /// (drafts copied from earlier in the text, verified several at a time; the same output).
    #[arg(long)]
    speculate: bool,
    /// With --speculate: tokens drafted at most per step (speculation.draft_tokens; default 4).
    #[arg(long, value_name = "N", requires = "speculate")]
    draft_tokens: Option<usize>,
    /// With --speculate: leave the speculator to measurement (`speculator = "measured"`) on the
    /// text of FILE, the prompt of a typical request (`monogen bench --model DIR` measures it).
    #[arg(long, value_name = "FILE", requires = "speculate")]
    typical_text: Option<PathBuf>,
    /// Requests a process serves per load of the model from its checkpoint, if the load
    /// should count in the choice of kernels (1: a process per request); default: not counted.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    requests_per_load: Option<u64>,
    /// Decoders: the tokens requests typically share at their start (a system prompt); a server
    /// then keeps finished requests' KV caches for the requests that start with them, and a
    /// library Session's generate_anew its own (request.shared_prefix_len).
    #[arg(long, value_name = "N")]
    shared_prefix_len: Option<usize>,
    /// Hardware class whose measurements (rankings/<CLASS>/) choose the kernels: `this`
    /// (this machine's), `none` (declared priority only), or a class name.
    #[arg(long, default_value = "this", value_name = "CLASS")]
    hardware: String,
    /// Overwrite FILE if it exists.
    #[arg(long)]
    force: bool,
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    match s {
        "f32" => Ok(Dtype::F32),
        "bf16" => Ok(Dtype::Bf16),
        "f16" => Ok(Dtype::F16),
        "int8" => Ok(Dtype::Int8),
        "int4" => Ok(Dtype::Int4),
        other => Err(format!("unknown dtype `{other}`; use f32, bf16, f16, int8 or int4")),
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

fn project(root: Option<PathBuf>, rankings: Option<PathBuf>) -> Result<Project, Error> {
    Project::load_with(&find_root(root)?, rankings.as_deref())
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
        Command::Init(args) => init(cli.root, args),
        Command::Explain { workload, out, krate, json } => {
            let project = project(cli.root, cli.rankings)?;
            let (workload, out) = match krate {
                Some(dir) => (check::crate_workload(&dir)?, Some(dir)),
                None => (workload.expect("clap requires a workload without --crate"), out),
            };
            let w = project.read_workload(&workload)?;
            let dir = out.unwrap_or_else(|| project.default_out_dir(&w.name));
            let plan = project.plan_for(&w, &workload, &dir)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&plan).expect("a plan always serializes"));
            } else {
                print!("{}", monogen::explain::render(&plan, &workload, &dir));
                if let Some(quality) =
                    monogen::eval::describe(&project, &w, &workload, &project.emit(&plan)?)?
                {
                    println!("\n{quality}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Build { workloads, out, crates, force } => {
            if out.is_some() && workloads.len() > 1 {
                return Err(Error::Refused("--out takes one workload; build the others separately".into()));
            }
            let project = project(cli.root, cli.rankings)?;
            if out.is_none()
                && let Some(outside) = workloads.iter().find(|p| p.exists() && !project.owns(p))
            {
                return Err(Error::Refused(format!(
                    "{} is outside the monogen repository {}: pass --out DIR for its crate (generated/ holds the crates of the repository's own workloads)",
                    shown(outside),
                    project.root.display()
                )));
            }
            let mut targets: Vec<(PathBuf, Option<PathBuf>)> =
                workloads.into_iter().map(|w| (w, out.clone())).collect();
            for dir in crates {
                targets.push((check::crate_workload(&dir)?, Some(dir)));
            }
            for (path, out) in &targets {
                let (plan, output) = project.generate_into(path, out.as_deref())?;
                let dir = out.clone().unwrap_or_else(|| project.default_out_dir(&plan.name));
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
        Command::Bench { workloads, crates, build_only: true, .. } => {
            let project = project(cli.root, cli.rankings)?;
            let crates = crates.iter().map(|c| check::crate_workload(c)).collect::<Result<Vec<_>, _>>()?;
            for path in workloads.iter().chain(&crates) {
                println!("{}", monogen::bench::build_only(&project, path)?.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            workloads,
            crates,
            stale,
            json,
            samples,
            warm_up,
            min_sample_us,
            dry_run,
            no_confirm,
            verify,
            recheck,
            confirm_rounds,
            interfaces,
            model,
            ..
        } => {
            let options = monogen::bench::Options {
                timing: monogen::bench::Timing {
                    samples: samples as usize,
                    warm_up: warm_up as usize,
                    min_sample_us,
                },
                only: interfaces,
                dry_run,
                confirm: !no_confirm,
                verify,
                recheck,
                confirm_rounds: confirm_rounds as usize,
                crate_dir: None,
            };
            let project = project(cli.root, cli.rankings)?;
            let mut targets = Vec::new();
            for path in workloads {
                let w = project.read_workload(&path)?;
                let dir = project.default_out_dir(&w.name);
                targets.push((path, dir, false));
            }
            for dir in crates {
                targets.push((check::crate_workload(&dir)?, dir, true));
            }
            bench(project, &targets, &options, stale, json, model.as_deref())
        }
        Command::Eval { workload, krate, model, models, stale, text, json } => {
            let project = project(cli.root, cli.rankings)?;
            if stale {
                let models = models.expect("clap requires --models with --stale");
                return eval_stale(&project, &krate, &models);
            }
            let model = model.expect("clap requires --model without --stale");
            let (path, krate) = match (&workload, krate.as_slice()) {
                (Some(path), _) => (path.clone(), None),
                (None, [dir]) => (check::crate_workload(dir)?, Some(dir.as_path())),
                (None, _) => {
                    return Err(monogen::Error::Refused(
                        "eval takes one --crate; to evaluate several, those that need it, add --stale and --models DIR".into(),
                    ));
                }
            };
            let run = eval_one(&project, &path, krate, &model, text.as_deref(), json)?;
            Ok(if run.misses.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::SynthWeights { workload, out, seed } => {
            let project = project(cli.root, cli.rankings)?;
            let w = project.read_workload(&workload)?;
            let parameters = monogen::synth::write_model_dir(&w, &out, seed)?;
            let (dtype, bytes) = match w.weights.dtype {
                // Int8 and int4 crates quantize a bfloat16 checkpoint at load.
                monogen::workload::Dtype::Int8 | monogen::workload::Dtype::Int4 => ("bf16", 2),
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
            let project = project(cli.root, cli.rankings)?;
            let changed = monogen::affected::changed_files(&project.root, &base)?;
            let result = monogen::affected::affected(&project, &changed)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&result).expect("results serialize"));
            } else {
                print!("{}", result.render(&base));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { workloads, all, out, crates } => {
            let project = project(cli.root, cli.rankings)?;
            let report = check::check(&project, &check::Request { workloads, all, out, crates })?;
            print!("{}", report.render());
            Ok(if report.is_clean() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
    }
}

fn progress_bar(hidden: bool) -> indicatif::ProgressBar {
    if hidden || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(1);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} rounds, {eta} left  {msg}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// `monogen init`.
fn init(root: Option<PathBuf>, args: InitArgs) -> Result<ExitCode, Error> {
    let InitArgs {
        hf,
        name,
        output,
        dtype,
        activations,
        classifier_dtype,
        kv_cache,
        device,
        cuda_arch,
        threads,
        cpu_features,
        max_seq_len,
        prompt_len,
        decode_len,
        max_batch,
        serve,
        speculate,
        draft_tokens,
        typical_text,
        requests_per_load,
        shared_prefix_len,
        hardware,
        force,
    } = args;
    let templates = monogen::emit::Templates::load(&find_root(root)?)?;
    let cuda = device == "cuda";
    let cuda_arch = match (cuda, cuda_arch) {
        (true, Some(arch)) => Some(arch),
        (true, None) => {
            return Err(Error::Refused(format!(
                "--device cuda needs --cuda-arch, the GPU architecture to compile for: one of {}",
                monogen::workload::CUDA_ARCHES.join(", ")
            )));
        }
        (false, Some(_)) => return Err(Error::Refused("--cuda-arch is only for --device cuda".into())),
        (false, None) => None,
    };
    // A GPU is no hardware class of this machine's CPU: a CUDA workload names one (`nvidia-h100`)
    // or is chosen for by declared priority.
    let hardware = if cuda && hardware == "this" { "none".to_string() } else { hardware };
    let threads = threads.or(cuda.then_some(1));
    // A CUDA crate's host code only loads, launches and samples: it asks nothing of the CPU, so
    // that it runs on whichever host the GPU is in.
    let cpu_features = if cuda && cpu_features == "native" { "none".to_string() } else { cpu_features };
    let opts = InitOptions {
        name,
        dtype,
        activations,
        classifier_dtype,
        kv_cache,
        threads,
        cpu_features: CpuFeatures::parse(&cpu_features).map_err(Error::Refused)?,
        max_seq_len,
        typical_prompt_len: prompt_len,
        typical_decode_len: decode_len,
        hardware: init::parse_hardware(&hardware)?,
        max_batch,
        serve,
        speculation: speculate.then(|| monogen::workload::Speculation::prompt_lookup(draft_tokens)),
        typical_text,
        requests_per_load,
        shared_prefix_len,
        cuda_arch,
    };
    let label = output.clone().unwrap_or_else(|| PathBuf::from("<standard output>"));
    let text = init::workload_file(&hf, &opts, &templates, &label)?;
    match output {
        None => print!("{text}"),
        Some(path) => {
            init::write_workload_file(&path, &text, force)?;
            eprintln!("wrote {}", shown(&path));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `monogen bench`: each workload's report, as text or as one JSON document. `targets` are
/// the workload files with their crates' folders, and whether the folder was named with
/// `--crate`; with `stale`, each is measured only for the
/// interfaces `check` finds unmeasured, and skipped when there are none.
fn bench(
    mut project: Project,
    targets: &[(PathBuf, PathBuf, bool)],
    options: &monogen::bench::Options,
    stale: bool,
    json: bool,
    model: Option<&Path>,
) -> Result<ExitCode, Error> {
    let mut reports = Vec::new();
    // --model measures speculation: refused before anything is measured where a workload
    // names its speculator itself.
    if let Some(model) = model {
        for (path, _, _) in targets {
            if monogen::speculation::measured(&project.read_workload(path)?).is_none() {
                return Err(Error::Refused(format!(
                    "--model {} is read to measure speculation, and {} names its speculator itself (or has no [speculation]); `speculator = \"measured\"` leaves it to `bench --model`",
                    shown(model),
                    shown(path)
                )));
            }
        }
    }
    for (path, dir, from_crate) in targets {
        let mut options = options.clone();
        if *from_crate {
            options.crate_dir = Some(dir.clone());
        }
        // Speculation is measured on real weights, apart from the kernels: `--interface
        // speculator` asks for it alone.
        let w = project.read_workload(path)?;
        let measured = monogen::speculation::measured(&w).is_some();
        let speculation_only = !options.only.is_empty() && options.only.iter().all(|i| i == "speculator");
        options.only.retain(|i| i != "speculator");
        if let (Some(model), true) = (model, measured) {
            // What `check` would ask for: whether the workload's class lacks a fresh measurement.
            let unmeasured = monogen::speculation::decide(&w, &project.rankings, &project.registry)
                .and_then(|d| d.unmeasured);
            let here = monogen::host::this_class();
            let elsewhere = w.target.hardware.as_deref().is_some_and(|class| class != here);
            if stale && unmeasured.is_some() && elsewhere {
                eprintln!(
                    "{}: its speculation lacks a fresh measurement on its hardware class {}, and this machine is {here}: run `monogen bench --stale --model DIR` on a {} machine",
                    shown(path),
                    w.target.hardware.as_deref().unwrap_or_default(),
                    w.target.hardware.as_deref().unwrap_or_default()
                );
            } else if !stale || unmeasured.is_some() {
                let bar = progress_bar(json);
                let report = monogen::bench::bench_speculation(&mut project, path, model, &options, |p| {
                    show_progress(&bar, path, p)
                })?;
                bar.finish_and_clear();
                if !json {
                    print!("{}", report.render());
                }
                reports.push(serde_json::to_value(&report).expect("reports serialize"));
            }
        } else if speculation_only {
            return Err(Error::Refused(format!(
                "`--interface speculator` measures speculation on real weights: add --model DIR{}",
                if measured {
                    ""
                } else {
                    ", with `speculator = \"measured\"` under the workload's [speculation]"
                }
            )));
        } else if measured && !json {
            eprintln!(
                "{}: its speculator is left to measurement; `--model DIR` (the model's real weights) measures it",
                shown(path)
            );
        }
        if speculation_only {
            continue;
        }
        if stale {
            let found = monogen::bench::stale(&project, path, dir)?;
            let interfaces = match &found {
                monogen::bench::Stale::Measure { interfaces } => interfaces
                    .iter()
                    .filter(|i| options.only.is_empty() || options.only.contains(i))
                    .cloned()
                    .collect(),
                _ => Vec::new(),
            };
            let note = match &found {
                monogen::bench::Stale::Fresh => Some("every record its choices rest on is fresh".to_string()),
                monogen::bench::Stale::OtherClass { class, this_machine, interfaces } => Some(format!(
                    "{} lack fresh records on its hardware class {class}, and this machine is {this_machine}: run `monogen bench --stale` on a {class} machine",
                    interfaces.join(", ")
                )),
                monogen::bench::Stale::Measure { .. } if interfaces.is_empty() => {
                    Some("none of the interfaces named with --interface is stale".to_string())
                }
                monogen::bench::Stale::Measure { .. } => None,
            };
            if let Some(note) = note {
                eprintln!("{}: nothing to measure here: {note}", shown(path));
                reports.push(serde_json::json!({ "workload": shown(path), "skipped": note, "stale": found }));
                continue;
            }
            eprintln!("{}: measuring the stale interfaces {}", shown(path), interfaces.join(", "));
            options.only = interfaces;
        }
        let bar = progress_bar(json);
        let report = monogen::bench::bench(&mut project, path, &options, |p| show_progress(&bar, path, p))?;
        bar.finish_and_clear();
        if !json {
            print!("{}", report.render());
        }
        reports.push(serde_json::to_value(&report).expect("reports serialize"));
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

/// Shows `bench`'s progress on `bar`.
fn show_progress(bar: &indicatif::ProgressBar, path: &Path, p: Progress) {
    match p {
        Progress::Compiling => bar.set_message(format!("{}: compiling the benchmark harness", shown(path))),
        Progress::Validating => bar.set_message(format!("{}: validating", shown(path))),
        Progress::Rounds(n) => {
            bar.set_length(n as u64);
            bar.set_position(0);
            bar.reset_eta();
        }
        Progress::Round(interface) => {
            bar.set_message(format!("{}: {interface}", shown(path)));
            bar.inc(1);
        }
        Progress::Confirming(interface) => bar.set_message(format!(
            "{}: checking the flip of {interface} end to end (building the crate both ways)",
            shown(path)
        )),
        Progress::Verifying(interface) => bar.set_message(format!(
            "{}: checking the choice of {interface} against its runner-up end to end (building the crate both ways)",
            shown(path)
        )),
        Progress::BuildingCandidate(candidate) => {
            bar.set_message(format!("{}: building the candidate crate of {candidate}", shown(path)))
        }
        Progress::SpeculationRound(round, rounds) => {
            bar.set_length(rounds as u64);
            bar.set_position(round as u64 - 1);
            bar.set_message(format!("{}: decoding the typical text with each candidate", shown(path)));
        }
    }
}

/// `monogen eval` of one workload (at `path`, its crate in `krate` where given) on `model`,
/// with a progress bar, printing the figures (or the record as JSON) and whether they clear
/// the bar.
fn eval_one(
    project: &Project,
    path: &Path,
    krate: Option<&Path>,
    model: &Path,
    text: Option<&Path>,
    json: bool,
) -> Result<monogen::eval::EvalRun, monogen::Error> {
    let bar = progress_bar(json);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} windows, {eta} left")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_message("building");
    let run = monogen::eval::eval(project, path, krate, model, text, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&run.record).expect("records serialize"));
    } else {
        println!(
            "{} against f32 over the {} text: {}",
            run.workload,
            run.record.text,
            run.record.figures.render()
        );
        match &run.bar {
            None => println!("no [quality] bar to hold it to"),
            Some(_) if run.misses.is_empty() => println!("clears its [quality] bar"),
            Some(_) => {
                for miss in &run.misses {
                    println!("FAILS its bar: {miss}");
                }
            }
        }
        println!("recorded in {}", shown(&run.recorded));
    }
    Ok(run)
}

/// `monogen eval --stale --crate DIR... --models MODELS`: evaluates, on MODELS/NAME, each crate
/// NAME that `check` would ask an evaluation of, or whose record is of other weights than
/// MODELS/NAME's, once every such crate's model is found; exit 1 when one misses its bar.
fn eval_stale(project: &Project, crates: &[PathBuf], models: &Path) -> Result<ExitCode, monogen::Error> {
    let mut todo = Vec::new();
    for dir in crates {
        let model = models.join(dir.file_name().map(PathBuf::from).unwrap_or_default());
        match monogen::eval::stale(project, dir, Some(&model))? {
            monogen::eval::Stale::Nothing(why) => println!("{}: nothing to evaluate ({why})", shown(dir)),
            monogen::eval::Stale::Evaluate(why) => {
                println!("{}: needs an evaluation ({why})", shown(dir));
                if !model.join("config.json").is_file() {
                    return Err(monogen::Error::Refused(format!(
                        "{} needs an evaluation ({why}), and {} is not its model's folder (it has no config.json): --models holds each crate's model in a folder named as the crate's",
                        shown(dir),
                        shown(&model)
                    )));
                }
                todo.push((dir, model));
            }
        }
    }
    let mut missed = false;
    for (dir, model) in todo {
        println!("{}: evaluating on {}", shown(dir), shown(&model));
        let path = check::crate_workload(dir)?;
        missed |= !eval_one(project, &path, Some(dir), &model, None, false)?.misses.is_empty();
    }
    Ok(if missed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
