//! `monogen bench`: measure every competing implementation of a workload on this machine and
//! record the results in the ranking database.
//!
//! The steps are separate so that each can be tested: [`harness::emit`] writes the harness
//! crate in memory; [`build_harness`] compiles it; [`run_harness`] runs it and parses its JSON
//! lines; [`summarize`] turns samples into distributions; [`records`] turns those into
//! [`Record`]s keyed by this machine. Only this module (and `init`) reads the host.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::emit::harness;
use crate::host::Host;
use crate::plan::Plan;
use crate::rankings::{self, BUILD_FLAGS, Confirmation, Record, Status, median_p90};
use crate::registry::Registry;
use crate::workload::Workload;
use crate::{Error, Project};

/// How long to measure.
#[derive(Debug, Clone)]
pub struct Timing {
    pub samples: usize,
    pub warm_up: usize,
    pub min_sample_us: u64,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing { samples: 21, warm_up: 3, min_sample_us: 2000 }
    }
}

/// One line the harness prints.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Begin { interfaces: usize, rounds: usize },
    Round { interface: String },
    Result(RawResult),
}

/// A candidate's outcome, as the harness reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct RawResult {
    pub interface: String,
    pub implementation: String,
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub decode_steps: usize,
    /// Sequences one timed decode step served (a batched step's rows); 1 unless batched.
    #[serde(default = "one")]
    pub decode_rows: usize,
    #[serde(default)]
    pub prefill_ns: Vec<f64>,
    #[serde(default)]
    pub decode_ns: Vec<f64>,
    /// A candidate that packs its weights: the time its packing of the model's matrices took
    /// (the sum of each matrix's median of three packings), and the sum of each one's slowest.
    #[serde(default)]
    pub load_ns: Option<f64>,
    #[serde(default)]
    pub load_max_ns: Option<f64>,
}

fn one() -> usize {
    1
}

/// A candidate's outcome, summarized.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub interface: String,
    pub implementation: String,
    pub version: String,
    #[serde(flatten)]
    pub result: Measured,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Measured {
    Ok {
        /// Per request: one prefill pass plus `decode_steps` decode steps (a sequence's share
        /// of each, where a step serves a batch).
        median_ns: f64,
        p90_ns: f64,
        samples: usize,
        prefill_median_ns: f64,
        decode_median_ns: f64,
        /// The request of each timed round, in the order of the rounds.
        rounds_ns: Vec<f64>,
        /// What it adds to a crate's load (a candidate that packs its weights), and the same
        /// with each matrix's slowest packing.
        #[serde(skip_serializing_if = "Option::is_none")]
        load_ns: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        load_max_ns: Option<f64>,
    },
    Failed {
        reason: String,
    },
    /// Not run: this machine cannot (a missing CPU feature).
    Skipped {
        reason: String,
    },
}

/// Turns the harness's samples into distributions of the time one typical request spends in
/// the interface: each round's prefill pass plus `decode_steps` times its share of a decode
/// step (the whole step, or a batched step's time over the `decode_rows` sequences it served).
pub fn summarize(raw: &RawResult, version: &str) -> Outcome {
    let result = match raw.status.as_str() {
        "ok" => {
            let share: Vec<f64> = raw.decode_ns.iter().map(|d| d / raw.decode_rows.max(1) as f64).collect();
            let requests: Vec<f64> =
                raw.prefill_ns.iter().zip(&share).map(|(p, d)| p + raw.decode_steps as f64 * d).collect();
            let (median_ns, p90_ns) = median_p90(&requests);
            Measured::Ok {
                median_ns,
                p90_ns,
                samples: requests.len(),
                prefill_median_ns: median_p90(&raw.prefill_ns).0,
                decode_median_ns: median_p90(&share).0,
                rounds_ns: requests,
                load_ns: raw.load_ns,
                load_max_ns: raw.load_max_ns,
            }
        }
        "failed" => Measured::Failed { reason: raw.reason.clone().unwrap_or_default() },
        _ => Measured::Skipped { reason: raw.reason.clone().unwrap_or_default() },
    };
    Outcome {
        interface: raw.interface.clone(),
        implementation: raw.implementation.clone(),
        version: version.to_string(),
        result,
    }
}

/// What a run's records are keyed by, beyond the machine: the harness's hash and the lock
/// file it was built with.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    pub harness_sha256: Option<String>,
    /// The harness's Cargo.lock after its build.
    pub lock: Option<rankings::CargoLock>,
}

/// The records of `outcomes` (skipped candidates have none), keyed by this machine.
pub fn records(
    outcomes: &[Outcome],
    plan: &Plan,
    registry: &Registry,
    host: &Host,
    keys: &Keys,
    measured_at: &str,
) -> BTreeMap<String, Vec<Record>> {
    let batch = match &plan.consts {
        crate::plan::Consts::Llama(c) => c.request.max_batch,
        crate::plan::Consts::Bert(_) => 1,
    };
    let mut out: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for o in outcomes {
        let shapes = rankings::interface_shapes(&plan.shapes, batch, &o.interface);
        let element = plan.interface(&o.interface).and_then(|i| i.element.as_deref());
        let Some(imp) = registry.implementation(&o.interface, &o.implementation, element) else { continue };
        let base = Record {
            implementation: o.implementation.clone(),
            element: rankings::element_key(imp),
            version: imp.version.clone(),
            source_sha256: rankings::measured_source_sha256(imp, registry),
            shapes: shapes.clone(),
            cpu: host.cpu.clone(),
            cores: host.cores,
            cpu_features: host.cpu_features.clone(),
            rustc: host.rustc.clone(),
            build_flags: BUILD_FLAGS.to_string(),
            harness_sha256: keys.harness_sha256.clone(),
            dependencies: keys.lock.as_ref().map(|lock| lock.closure(&imp.dependencies)),
            measured_at: measured_at.to_string(),
            status: Status::Ok,
            failure: None,
            median_ns: 0,
            p90_ns: 0,
            samples: 0,
            prefill_median_ns: 0,
            decode_median_ns: 0,
            load_ns: None,
            load_max_ns: None,
            rounds_ns: Vec::new(),
            load_counted_ns: 0,
            load_counted_max_ns: 0,
        };
        let record = match &o.result {
            Measured::Ok {
                median_ns,
                p90_ns,
                samples,
                prefill_median_ns,
                decode_median_ns,
                rounds_ns,
                load_ns,
                load_max_ns,
            } => Record {
                median_ns: median_ns.round() as u64,
                p90_ns: p90_ns.round() as u64,
                samples: *samples,
                prefill_median_ns: prefill_median_ns.round() as u64,
                decode_median_ns: decode_median_ns.round() as u64,
                rounds_ns: rounds_ns.iter().map(|t| t.round() as u64).collect(),
                load_ns: load_ns.map(|ns| ns.round() as u64),
                load_max_ns: load_max_ns.map(|ns| ns.round() as u64),
                ..base
            },
            Measured::Failed { reason } => {
                Record { status: Status::Failed, failure: Some(reason.clone()), ..base }
            }
            Measured::Skipped { .. } => continue,
        };
        out.entry(o.interface.clone()).or_default().push(record);
    }
    out
}

/// Where harness sources are written: `<root>/target/monogen-bench`.
pub fn bench_dir(project: &Project) -> PathBuf {
    project.root.join("target").join("monogen-bench")
}

/// Where harnesses are compiled: `MONOGEN_BENCH_TARGET_DIR`, else `<bench dir>/target`.
/// Harness crate names carry a hash of their sources, so one folder can serve many
/// repositories at once.
pub fn bench_target_dir(project: &Project) -> PathBuf {
    std::env::var_os("MONOGEN_BENCH_TARGET_DIR")
        .map_or_else(|| bench_dir(project).join("target"), PathBuf::from)
}

/// Where whole crates are compiled in release (`bench`'s end-to-end checks, `eval`), apart
/// from the harnesses, whose profile unwinds: one folder, so that they share dependencies.
pub fn crates_target_dir(project: &Project) -> PathBuf {
    bench_target_dir(project).join("crates")
}

/// What `bench --stale` measures of one workload: the interfaces whose competing
/// implementations `check` finds without a fresh record on the workload's hardware class, for
/// the crate in `dir` (its monogen.lock's choices are the incumbents, as for `check`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Stale {
    /// These interfaces need measuring, and this machine is of the workload's class.
    Measure { interfaces: Vec<String> },
    /// Every record the workload's choices rest on is fresh (or it names no hardware class).
    Fresh,
    /// Records are missing or stale, but on another class than this machine's.
    OtherClass { class: String, this_machine: String, interfaces: Vec<String> },
}

/// [`Stale`] for the workload at `path` whose crate is in `dir`.
pub fn stale(project: &Project, path: &Path, dir: &Path) -> Result<Stale, Error> {
    let w = project.read_workload(path)?;
    let plan = project.plan_for(&w, path, dir)?;
    let interfaces: Vec<String> =
        plan.interfaces.iter().filter(|i| !i.unmeasured.is_empty()).map(|i| i.interface.clone()).collect();
    let Some(class) = &w.target.hardware else { return Ok(Stale::Fresh) };
    if interfaces.is_empty() {
        return Ok(Stale::Fresh);
    }
    let host = Host::detect().map_err(Error::Refused)?;
    if host.class != *class {
        return Ok(Stale::OtherClass { class: class.clone(), this_machine: host.class, interfaces });
    }
    Ok(Stale::Measure { interfaces })
}

/// Writes and compiles the harness that `bench` would run for the workload at `path` on this
/// machine, and returns its executable without running it: what `bench/same_harness.sh`
/// compares between two trees, candidate by candidate.
pub fn build_only(project: &Project, path: &Path) -> Result<PathBuf, Error> {
    let mut here = project.read_workload(path)?;
    here.target.hardware = Some(Host::detect().map_err(Error::Refused)?.class);
    let plan = project.plan(&here, path)?;
    let (crate_dir, name) = write_harness(project, &plan, &bench_dir(project))?;
    seed_lock(project, &crate_dir)?;
    build_harness(&crate_dir, &bench_target_dir(project), &name)
}

/// Writes the harness crate of `plan` under `dir/<workload>/` (files that did not change are
/// left alone, so cargo rebuilds only what it must); returns its folder and crate name.
pub fn write_harness(project: &Project, plan: &Plan, dir: &Path) -> Result<(PathBuf, String), Error> {
    let (output, name) = harness::emit(plan, &project.registry, &project.templates)?;
    let crate_dir = dir.join(&plan.name);
    // Kernels of candidates that no longer compete must not linger under src/.
    crate::write::sync_folder(&crate_dir, &output.files, Path::new("src"))?;
    Ok((crate_dir, name))
}

/// Gives the harness in `crate_dir` the monogen repository's Cargo.lock, so that it builds its
/// kernels' dependencies at the versions that lock pins (cargo drops the rest of it), which
/// its records then name and `check` compares with the lock.
pub fn seed_lock(project: &Project, crate_dir: &Path) -> Result<(), Error> {
    let lock = project.root.join("Cargo.lock");
    match std::fs::read(&lock) {
        Ok(bytes) => {
            crate::write::write_file(&crate_dir.join("Cargo.lock"), &bytes)?;
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(&lock, e)),
    }
}

/// Compiles the harness in `crate_dir` (release) with its target folder at `target_dir`;
/// returns the executable.
pub fn build_harness(crate_dir: &Path, target_dir: &Path, name: &str) -> Result<PathBuf, Error> {
    build_release(
        crate_dir,
        target_dir,
        name,
        "the benchmark harness",
        " (an implementation's source is broken?)",
    )
}

/// Compiles `what`, the crate in `crate_dir` named `name`, in release (its own profile) with
/// its target folder at `target_dir`, without the caller's RUSTFLAGS; returns the executable.
/// `hint` follows the compiler's refusal.
pub(crate) fn build_release(
    crate_dir: &Path,
    target_dir: &Path,
    name: &str,
    what: &str,
    hint: &str,
) -> Result<PathBuf, Error> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(crate_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .map_err(|e| Error::Refused(format!("cannot run `{cargo}` to build {what}: {e}")))?;
    if !out.status.success() {
        return Err(Error::Refused(format!(
            "{what} in {} does not compile{hint}:\n{}",
            crate_dir.display(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        )));
    }
    let exe = target_dir.join("release").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !exe.exists() {
        return Err(Error::Refused(format!("cargo built {what}, but {} is missing", exe.display())));
    }
    Ok(exe)
}

/// Runs the harness, passing each event to `progress`; returns the results.
pub fn run_harness(
    exe: &Path,
    timing: &Timing,
    mut progress: impl FnMut(&Event),
) -> Result<Vec<RawResult>, Error> {
    let mut child = Command::new(exe)
        .args(["--samples", &timing.samples.to_string()])
        .args(["--warm-up", &timing.warm_up.to_string()])
        .args(["--min-sample-us", &timing.min_sample_us.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(exe, e))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut results = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| Error::io(exe, e))?;
        let event: Event = serde_json::from_str(&line).map_err(|e| {
            Error::Refused(format!("the benchmark harness printed a line monogen cannot read ({e}): {line}"))
        })?;
        progress(&event);
        if let Event::Result(r) = event {
            results.push(r);
        }
    }
    let output = child.wait_with_output().map_err(|e| Error::io(exe, e))?;
    if !output.status.success() {
        return Err(Error::Refused(format!(
            "the benchmark harness {} failed ({}):\n{}",
            exe.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim_end()
        )));
    }
    Ok(results)
}

/// Now, in UTC, as RFC 3339 (`2026-11-29T21:04:05Z`).
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Seconds since the Unix epoch → RFC 3339 in UTC (Howard Hinnant's days-to-civil).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
}

/// What `monogen bench` is asked to do for each workload.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub timing: Timing,
    /// Measure only these interfaces (all when empty).
    pub only: Vec<String>,
    /// Measure and report, but leave rankings/ as it is.
    pub dry_run: bool,
    /// Check each flip away from a measured incumbent end to end before `build` adopts it
    /// (`--no-confirm` turns it off).
    pub confirm: bool,
    /// Then check each measured choice against its runner-up end to end (`--verify`).
    pub verify: bool,
    /// With `verify`: check again the choices whose check is on record for their current
    /// sources at these shapes (`--recheck`), which are otherwise not timed again.
    pub recheck: bool,
    /// Rounds of that check.
    pub confirm_rounds: usize,
    /// The crate whose choices the new ones are compared with, when it was named with
    /// `--crate` (default: generated/<name>/).
    pub crate_dir: Option<PathBuf>,
}

/// Where a run of the harness is, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    Compiling,
    Validating,
    /// The harness will time this many rounds.
    Rounds(usize),
    /// One round of this interface is done.
    Round(&'a str),
    /// Building and timing the crate both ways for a flip of this interface.
    Confirming(&'a str),
    /// Building and timing the crate with this interface's choice and with its runner-up.
    Verifying(&'a str),
    /// Building the crate of one speculation candidate (`none`, `2 drafts`, ...).
    BuildingCandidate(&'a str),
    /// Timing the speculation candidates: this round of that many.
    SpeculationRound(usize, usize),
}

/// A choice that the new measurements change.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub interface: String,
    pub from: String,
    pub to: String,
    pub reason: String,
}

/// One measured interface: its reference and what `build` now chooses (its candidates'
/// outcomes are the report's `results` of that interface).
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub interface: String,
    /// The implementation the others are compared with.
    pub reference: String,
    pub chosen: String,
}

/// What `monogen bench` did for one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub workload: String,
    #[serde(skip)]
    pub path: PathBuf,
    pub hardware: Host,
    /// The hardware class the workload names (`target.hardware`), when it is not this machine's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_hardware: Option<String>,
    pub shapes: String,
    pub build_flags: &'static str,
    pub measured_at: String,
    /// The request pattern, for the report's "time per typical request" line.
    #[serde(skip)]
    request: crate::workload::Request,
    pub results: Vec<Outcome>,
    #[serde(skip)]
    pub measurements: Vec<Measurement>,
    pub rankings_written: Vec<String>,
    pub choices_changed: Vec<Change>,
    /// Interfaces not measured: one competing implementation each, and no pass in the
    /// benchmark template to time it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub untimed: Vec<String>,
    /// The flips this run checked end to end (written to the class's confirmations.toml).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub confirmations: Vec<rankings::Confirmation>,
    /// `--verify`'s checks already on record for the choices' current sources, not timed again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_record: Vec<rankings::Confirmation>,
    pub dry_run: bool,
    /// Whether generated/ holds a crate of the workload to compare the choices with.
    #[serde(skip)]
    has_crate: bool,
    /// The crate named with `--crate`, if any.
    #[serde(skip)]
    crate_dir: Option<PathBuf>,
    /// The ranking database's folder, as the report shows it.
    #[serde(skip)]
    rankings_shown: String,
}

/// Measures every competing implementation of the workload at `path` on this machine, records
/// the results under rankings/<this machine's class>/ (unless `dry_run`), and reports what
/// `build` now chooses. A workload that names another hardware class (or none) is measured
/// all the same: the report says which class the records went to and how the workload uses them.
pub fn bench(
    project: &mut Project,
    path: &Path,
    options: &Options,
    mut progress: impl FnMut(Progress),
) -> Result<Report, Error> {
    let w = project.read_workload(path)?;
    if w.target.device == crate::workload::Device::Cuda {
        return Err(Error::Refused(format!(
            "{} targets a CUDA GPU: the authority does not time CUDA kernels yet (its harness runs on \
             the CPU), so a CUDA workload's kernels are chosen by declared priority",
            crate::shown(path)
        )));
    }
    let required = crate::resolve::required_interfaces(&w);
    if let Some(unknown) = options.only.iter().find(|name| !required.contains(&name.as_str())) {
        return Err(Error::Refused(format!(
            "`{unknown}` is not an interface of {}: it calls {}",
            crate::shown(path),
            required.join(", ")
        )));
    }
    let host = Host::detect().map_err(Error::Refused)?;
    let class = host.class.clone();
    // The workload as this machine's: the class whose records choose its kernels here.
    let mut here = w.clone();
    here.target.hardware = Some(class.clone());
    let workload_hardware = match &w.target.hardware {
        None => Some("none".to_string()),
        Some(c) if *c == class => None,
        Some(c) => Some(c.clone()),
    };

    let workload_crate = options.crate_dir.clone().unwrap_or_else(|| project.default_out_dir(&w.name));
    if options.verify {
        return verify(project, &w, &here, path, &workload_crate, host, workload_hardware, options, progress);
    }

    // The interfaces to measure, and the harness that measures them (and no others): those
    // that the benchmark template can time (an interface with one implementation and no pass,
    // a new slot, has nothing to rank).
    let mut plan = project.plan_for(&here, path, &workload_crate)?;
    // A role's own instance (the classifier's matmul) is chosen by declared priority, not timed.
    plan.interfaces
        .retain(|i| i.role.is_none() && (options.only.is_empty() || options.only.contains(&i.interface)));
    let timed = harness::timed(&plan, &project.templates)?;
    let untimed: Vec<String> =
        plan.interfaces.iter().map(|i| i.interface.clone()).filter(|i| !timed.contains(i)).collect();
    if let Some(one) = options.only.iter().find(|o| untimed.contains(o)) {
        return Err(Error::Refused(format!(
            "`{one}` has one competing implementation for {} and no pass in the benchmark template: nothing to rank",
            crate::shown(path)
        )));
    }
    let measured: Vec<&str> = required.iter().copied().filter(|i| timed.iter().any(|t| t == i)).collect();
    plan.interfaces.retain(|i| measured.contains(&i.interface.as_str()));
    progress(Progress::Compiling);
    let dir = bench_dir(project);
    let (crate_dir, crate_name) = write_harness(project, &plan, &dir)?;
    seed_lock(project, &crate_dir)?;
    let exe = build_harness(&crate_dir, &bench_target_dir(project), &crate_name)?;
    progress(Progress::Validating);
    let raw = run_harness(&exe, &options.timing, |event| match event {
        Event::Begin { rounds, .. } => progress(Progress::Rounds(*rounds)),
        Event::Round { interface } => progress(Progress::Round(interface)),
        Event::Result(_) => {}
    })?;

    let outcomes: Vec<Outcome> = raw
        .iter()
        .map(|r| {
            let element = plan.interface(&r.interface).and_then(|i| i.element.as_deref());
            let version = project
                .registry
                .implementation(&r.interface, &r.implementation, element)
                .map_or_else(String::new, |i| i.version.clone());
            summarize(r, &version)
        })
        .collect();
    let measured_at = now_utc();
    let keys = Keys {
        harness_sha256: project.rankings.current.harness_sha256.get(w.model.architecture().as_str()).cloned(),
        lock: Some(rankings::CargoLock::read(&crate_dir.join("Cargo.lock"))?),
    };
    let records = records(&outcomes, &plan, &project.registry, &host, &keys, &measured_at);
    let shapes = rankings::shapes_signature(&w);
    let mut updated = project.rankings.clone();
    for &interface in &measured {
        let shapes = rankings::interface_shapes(&shapes, w.decode_batch(), interface);
        let element = plan.interface(interface).and_then(|i| i.element.as_deref());
        // The records this run replaces: those of the element type it measured. Another
        // element type's records of the same shapes stay (the shapes do not name it).
        // Records of an implementation or element type the registry no longer has go too.
        let of_element = |r: &Record| match &r.element {
            Some(e) => {
                Some(e.as_str()) == element
                    || project.registry.implementation(interface, &r.implementation, Some(e)).is_none()
            }
            None => project
                .registry
                .implementations_of(interface)
                .iter()
                .find(|i| i.name == r.implementation && !i.several_elements)
                .is_none_or(|i| i.element.as_deref() == element),
        };
        let new = records.get(interface).cloned().unwrap_or_default();
        updated.replace(&class, interface, &shapes, new, of_element);
    }
    let mut written = Vec::new();
    if !options.dry_run {
        for &interface in &measured {
            let (rel, text) = updated.render(&class, interface);
            let file = project.rankings_dir.join(&rel);
            if crate::write::write_file(&file, text.as_bytes())? {
                written.push(crate::shown(&file));
            }
        }
    }
    // What `build` will choose now (on this machine), against what the crate holds.
    let before = project.rankings.clone();
    let mut new_plan = if options.dry_run {
        Project { rankings: updated, ..project.clone() }.plan_for(&here, path, &workload_crate)?
    } else {
        project.rankings = updated;
        project.plan_for(&here, path, &workload_crate)?
    };
    // A crate built for another class is not chosen from these records.
    let locked = locked_here(&workload_hardware, &workload_crate);
    let mut choices_changed = changes(&new_plan, &locked);
    // Each flip away from a measured incumbent is checked end to end before `build` adopts it.
    let mut confirmations = Vec::new();
    if options.confirm && !options.dry_run && !choices_changed.is_empty() {
        for change in &choices_changed {
            let incumbent_measured = here.target.hardware.as_deref().is_some_and(|class| {
                let (shapes, _) = rankings::records_shapes(&before, class, &change.interface, &here);
                before
                    .records(class, &change.interface)
                    .iter()
                    .any(|r| r.shapes == shapes && r.implementation == change.from)
            });
            if !incumbent_measured {
                continue;
            }
            progress(Progress::Confirming(&change.interface));
            let confirmation =
                confirm(project, &here, path, &workload_crate, change, &host, options.confirm_rounds.max(3))?;
            project.rankings.replace_confirmation(&class, confirmation.clone());
            confirmations.push(confirmation);
        }
        if !confirmations.is_empty() {
            written.extend(write_confirmations(project, &class)?);
            new_plan = project.plan_for(&here, path, &workload_crate)?;
            choices_changed = changes(&new_plan, &locked);
        }
    }
    let measurements = new_plan
        .interfaces
        .iter()
        .filter(|i| outcomes.iter().any(|o| o.interface == i.interface))
        .map(|i| Measurement {
            interface: i.interface.clone(),
            reference: i.reference.clone(),
            chosen: i.chosen.name.clone(),
        })
        .collect();
    Ok(Report {
        workload: w.name.clone(),
        path: path.to_path_buf(),
        hardware: host,
        workload_hardware,
        shapes,
        build_flags: BUILD_FLAGS,
        measured_at,
        request: w.request.clone(),
        results: outcomes,
        measurements,
        rankings_written: written,
        choices_changed,
        untimed,
        confirmations,
        on_record: Vec::new(),
        dry_run: options.dry_run,
        has_crate: !locked.is_empty(),
        crate_dir: options.crate_dir.clone(),
        rankings_shown: crate::shown(&project.rankings_dir),
    })
}

/// What `monogen bench --model DIR` measured of a workload whose speculator is left to
/// measurement.
#[derive(Debug, Clone, Serialize)]
pub struct SpeculationReport {
    pub workload: String,
    pub hardware: Host,
    /// One per candidate, none first.
    pub records: Vec<crate::speculation::Record>,
    /// What `build` now generates (`none`, or `prompt-lookup, N drafts`), and why.
    pub chosen: String,
    pub reason: String,
    /// What the crate holds now, where it has a lock that says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crate_has: Option<String>,
    /// The hardware class the workload names (`target.hardware`, `none` for none), when it is
    /// not this machine's: `chosen` is then what `build` would choose here, not for the crate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_hardware: Option<String>,
    pub rankings_written: Vec<String>,
    pub dry_run: bool,
}

/// Measures speculation for the workload at `path`, whose `[speculation]` leaves the speculator
/// to measurement: builds its crate once per candidate (no speculation, then prompt lookup with
/// each draft length of [`crate::workload::Speculation::draft_candidates`]), decodes the
/// workload's `typical_text` with each on the real weights in `model` (the typical number of
/// decode steps, with the crates' default greedy decoding), in `options.confirm_rounds`
/// interleaved rounds after one untimed run each, records the results under
/// rankings/<this machine's class>/speculation.toml (unless `dry_run`), and reports what
/// `build` now chooses.
pub fn bench_speculation(
    project: &mut Project,
    path: &Path,
    model: &Path,
    options: &Options,
    mut progress: impl FnMut(Progress),
) -> Result<SpeculationReport, Error> {
    use crate::speculation::{self, Record};
    let w = project.read_workload(path)?;
    let Some(spec) = speculation::measured(&w).cloned() else {
        return Err(Error::Refused(format!(
            "{} names its speculator itself, so there is no speculation to measure; `speculator = \"measured\"` under [speculation] leaves it to `bench --model`",
            crate::shown(path)
        )));
    };
    let crate::workload::Request::Decoder(request) = &w.request else {
        unreachable!("only decoders speculate (the workload parser refuses the rest)");
    };
    for file in ["config.json", "tokenizer.json"] {
        if !model.join(file).is_file() {
            return Err(Error::Refused(format!(
                "{} has no {file}; --model takes the Hugging Face folder of {}'s model (real weights: acceptance on synthetic ones says nothing)",
                crate::shown(model),
                w.name
            )));
        }
    }
    let host = Host::detect().map_err(Error::Refused)?;
    let class = host.class.clone();
    let mut here = w.clone();
    here.target.hardware = Some(class.clone());
    let key = speculation::Key::of(&here, &project.registry)
        .expect("the workload leaves its speculator to measurement");
    let workload_crate = options.crate_dir.clone().unwrap_or_else(|| project.default_out_dir(&w.name));
    let dir = bench_dir(project).join("speculation").join(&w.name);
    let target = crates_target_dir(project);
    let candidates = speculation::candidates(&spec);
    let tag = speculation::describe;
    let mut binaries = Vec::new();
    for &c in &candidates {
        progress(Progress::BuildingCandidate(&tag(c)));
        let mut candidate = here.clone();
        candidate.speculation = c.map(|(speculator, k)| spec.concrete(speculator, k));
        let mut plan = project.plan_for(&candidate, path, &workload_crate)?;
        let suffix = match c {
            None => "none".to_string(),
            Some((crate::workload::Speculator::DraftModel, k)) => format!("draft-k{k}"),
            Some((_, k)) => format!("k{k}"),
        };
        // Several packages in one target folder need several names.
        plan.name = format!("{}-spec-{suffix}", w.name);
        let output = project.emit(&plan)?;
        let out = dir.join(&suffix);
        crate::write::write(&out, &output, true)?;
        seed_lock(project, &out)?;
        binaries.push(build_release(&out, &target, &plan.name, "the crate", "")?);
    }
    let text = spec.typical_text.clone().unwrap_or_default();
    let decode_len = request.typical_decode_len.max(1);
    let rounds = options.confirm_rounds.max(3);
    // One untimed run each (the page cache, the tokenizer's file), which also gives the tokens
    // and the drafts: greedy decoding makes the same ones every round.
    let mut outputs = Vec::new();
    for exe in &binaries {
        outputs.push(decode_typical(exe, model, &text, decode_len)?);
    }
    let mut times: Vec<Vec<u64>> = vec![Vec::new(); binaries.len()];
    for round in 0..rounds {
        progress(Progress::SpeculationRound(round + 1, rounds));
        let n = binaries.len();
        // Each round starts with another candidate, and every other one runs backwards.
        let order: Vec<usize> =
            (0..n).map(|i| if round % 2 == 0 { (i + round) % n } else { (n - 1 - i + round) % n }).collect();
        for i in order {
            times[i].push(decode_typical(&binaries[i], model, &text, decode_len)?.ns);
        }
    }
    let measured_at = now_utc();
    let weights_sha256 = crate::eval::weights_sha256(model)?;
    let reference = outputs[0].generated.clone();
    let records: Vec<Record> = candidates
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let run = &outputs[i];
            let median = median_p90(&times[i].iter().map(|&t| t as f64).collect::<Vec<_>>()).0;
            Record {
                workload: key.workload.clone(),
                shapes: key.shapes.clone(),
                workload_sha256: key.workload_sha256.clone(),
                text_sha256: key.text_sha256.clone(),
                lookup_max: key.lookup_max,
                lookup_min: key.lookup_min,
                source_sha256: key.source_sha256.clone(),
                draft_sha256: key.draft_sha256.clone(),
                speculator: c.map_or(crate::workload::Speculator::None, |(s, _)| s).as_str().into(),
                draft_tokens: c.map_or(0, |(_, k)| k),
                weights_sha256: weights_sha256.clone(),
                model: crate::shown(model),
                cpu: host.cpu.clone(),
                cores: host.cores,
                rustc: host.rustc.clone(),
                measured_at: measured_at.clone(),
                prompt_tokens: run.prompt_tokens,
                generated: run.generated.len(),
                drafted: run.drafted,
                accepted: run.accepted,
                same_output: run.generated == reference,
                median_ns: median.round() as u64,
                rounds_ns: times[i].clone(),
            }
        })
        .collect();
    let mut updated = project.rankings.clone();
    speculation::replace(&mut updated, &class, &w.name, records.clone());
    let mut written = Vec::new();
    if !options.dry_run {
        let (rel, text) = speculation::render(&updated, &class);
        let file = project.rankings_dir.join(&rel);
        if crate::write::write_file(&file, text.as_bytes())? {
            written.push(crate::shown(&file));
        }
        project.rankings = updated.clone();
    }
    let decision = speculation::decide(&here, &updated, &project.registry).expect("measured");
    let workload_hardware = match &w.target.hardware {
        None => Some("none".to_string()),
        Some(c) if *c == class => None,
        Some(c) => Some(c.clone()),
    };
    // A crate of another class is not chosen from these records.
    let crate_has = match workload_hardware {
        None => crate::lock::Lock::read(&workload_crate)
            .ok()
            .map(|l| l.speculation.unwrap_or_else(|| "none".into())),
        Some(_) => None,
    };
    Ok(SpeculationReport {
        workload: w.name.clone(),
        hardware: host,
        records,
        chosen: decision.summary(),
        reason: decision.reason,
        crate_has,
        workload_hardware,
        rankings_written: written,
        dry_run: options.dry_run,
    })
}

/// One decode of the typical text by a candidate's binary.
#[derive(Debug)]
struct Decoded {
    /// Nanoseconds of the typical number of decode steps (at the time per token it reports).
    ns: u64,
    prompt_tokens: usize,
    generated: Vec<u64>,
    drafted: usize,
    accepted: usize,
}

/// Runs the crate binary `exe` on `model` with the prompt `text`, `decode_len` tokens at most.
fn decode_typical(exe: &Path, model: &Path, text: &str, decode_len: usize) -> Result<Decoded, Error> {
    let report = run_json(exe, model, &["--prompt", text], decode_len, &crate::shown(model))?;
    let ids = |key: &str| -> Vec<u64> {
        report[key]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default()
    };
    let generated = ids("generated_ids");
    let count = |key: &str| report[key].as_u64().unwrap_or(0) as usize;
    let per_token_ms = report["decode_ms"].as_f64().unwrap_or(0.0) / generated.len().max(1) as f64;
    Ok(Decoded {
        ns: (per_token_ms * decode_len as f64 * 1e6).round() as u64,
        prompt_tokens: ids("prompt_ids").len(),
        generated,
        drafted: count("drafted"),
        accepted: count("accepted"),
    })
}

impl SpeculationReport {
    /// The text `monogen bench --model` prints.
    pub fn render(&self) -> String {
        use crate::plan::human_ns;
        let h = &self.hardware;
        let none = &self.records[0];
        let mut s = format!(
            "{}: speculation on {} ({}, {} cores, {})\n  decoding the typical text ({} tokens) for {} tokens with {}, {} interleaved rounds\n",
            self.workload,
            h.class,
            h.cpu,
            h.cores,
            h.rustc,
            none.prompt_tokens,
            none.generated,
            none.model,
            none.rounds_ns.len()
        );
        for r in &self.records {
            let what = crate::speculation::describe(r.candidate());
            let mut line = format!("  {what:<30} {:>10} decoding", human_ns(r.median_ns as f64));
            if r.candidate().is_some() {
                let v = rankings::judge_rounds(&r.rounds_ns, &none.rounds_ns);
                line.push_str(&format!(
                    "  {:.2}x none's speed (noise margin {:.0}%), {:.0}% of {} drafts kept",
                    1.0 / v.ratio,
                    v.margin * 100.0,
                    r.kept_percent(),
                    r.drafted
                ));
                if !r.same_output {
                    line.push_str(", BUT its tokens differ from none's");
                }
            }
            s.push_str(&line);
            s.push('\n');
        }
        match &self.workload_hardware {
            None => s.push_str(&format!("  build chooses: {}\n", self.chosen)),
            Some(other) => s.push_str(&format!(
                "  on {} build would choose: {}; but the workload names hardware class {other} (target.hardware), whose records choose its crate\n",
                h.class, self.chosen
            )),
        }
        match &self.crate_has {
            Some(has) if *has != self.chosen => {
                s.push_str(&format!("  the crate has {has}; `monogen build` regenerates it\n"))
            }
            Some(_) => s.push_str("  the crate already has this choice\n"),
            None => {}
        }
        if self.dry_run {
            s.push_str("  dry run: rankings/ left as it was\n");
        }
        for file in &self.rankings_written {
            s.push_str(&format!("  wrote {file}\n"));
        }
        s
    }
}

/// `monogen bench --verify`: measures no kernel, but checks each measured choice that `build`
/// makes now for `here` (of `options.only`, or all) against its runner-up by the kernels'
/// records end to end, as a flip is checked, and records the confirmations: a runner-up that
/// the crate runs faster becomes the choice.
#[allow(clippy::too_many_arguments)]
fn verify(
    project: &mut Project,
    w: &Workload,
    here: &Workload,
    path: &Path,
    workload_crate: &Path,
    host: Host,
    workload_hardware: Option<String>,
    options: &Options,
    mut progress: impl FnMut(Progress),
) -> Result<Report, Error> {
    let class = host.class.clone();
    let plan = project.plan_for(here, path, workload_crate)?;
    let locked = locked_here(&workload_hardware, workload_crate);
    let shapes = rankings::shapes_signature(here);
    let mut confirmations = Vec::new();
    let mut on_record = Vec::new();
    let mut written = Vec::new();
    let checked = plan
        .interfaces
        .iter()
        .filter(|i| i.role.is_none() && (options.only.is_empty() || options.only.contains(&i.interface)));
    for i in checked {
        let Some(runner_up) = runner_up(i) else { continue };
        // A check on record for both sources at these shapes, made on this CPU with this
        // toolchain, stands until one of them changes.
        let recorded = || {
            let element = i.element.as_deref();
            let from = project.registry.implementation(&i.interface, &i.chosen.name, element)?;
            let to = project.registry.implementation(&i.interface, &runner_up, element)?;
            let c =
                project.rankings.confirmation(&class, &i.interface, &shapes, from, to, &project.registry)?;
            (c.cpu == host.cpu && c.cores == host.cores && c.rustc == host.rustc).then(|| c.clone())
        };
        if !options.recheck
            && let Some(c) = recorded()
        {
            on_record.push(c);
            continue;
        }
        let change = Change {
            interface: i.interface.clone(),
            from: i.chosen.name.clone(),
            to: runner_up,
            reason: "the runner-up by the kernels' records".into(),
        };
        progress(Progress::Verifying(&i.interface));
        let confirmation =
            confirm(project, here, path, workload_crate, &change, &host, options.confirm_rounds.max(3))?;
        project.rankings.replace_confirmation(&class, confirmation.clone());
        confirmations.push(confirmation);
    }
    if !confirmations.is_empty() {
        written.extend(write_confirmations(project, &class)?);
    }
    let new_plan = project.plan_for(here, path, workload_crate)?;
    Ok(Report {
        workload: w.name.clone(),
        path: path.to_path_buf(),
        hardware: host,
        workload_hardware,
        shapes: rankings::shapes_signature(w),
        build_flags: BUILD_FLAGS,
        measured_at: now_utc(),
        request: w.request.clone(),
        results: Vec::new(),
        measurements: Vec::new(),
        rankings_written: written,
        choices_changed: changes(&new_plan, &locked),
        untimed: Vec::new(),
        confirmations,
        on_record,
        dry_run: false,
        has_crate: !locked.is_empty(),
        crate_dir: options.crate_dir.clone(),
        rankings_shown: crate::shown(&project.rankings_dir),
    })
}

/// The choices of the crate in `dir` that this machine's records are compared with: none for a
/// workload of another class (`workload_hardware`), whose records choose its crate.
fn locked_here(workload_hardware: &Option<String>, dir: &Path) -> BTreeMap<String, String> {
    match workload_hardware {
        None => crate::lock::locked_choices(dir),
        Some(_) => BTreeMap::new(),
    }
}

/// Writes `class`'s confirmations to its file, and returns the file as shown where it changed.
fn write_confirmations(project: &Project, class: &str) -> Result<Option<String>, Error> {
    let (rel, text) = project.rankings.render_confirmations(class);
    let file = project.rankings_dir.join(&rel);
    Ok(crate::write::write_file(&file, text.as_bytes())?.then(|| crate::shown(&file)))
}

/// The fastest measured candidate of `i` by the kernels' records after its choice, if any
/// (one that failed against the reference, was rejected or is shadowed never is).
fn runner_up(i: &crate::plan::InterfacePlan) -> Option<String> {
    i.candidates
        .iter()
        .filter(|c| c.name != i.chosen.name && matches!(c.verdict, crate::plan::Verdict::Outranked { .. }))
        .filter_map(|c| Some((c.name.clone(), c.evidence.as_ref()?.fresh_distribution()?.median_ns)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(name, _)| name)
}

/// The choices of `plan` that differ from the crate's (`locked`).
fn changes(plan: &Plan, locked: &BTreeMap<String, String>) -> Vec<Change> {
    plan.interfaces
        .iter()
        .filter_map(|i| {
            // A role's own choice (the classifier's matmul) is made by declared priority.
            let old = locked.get(&i.interface).filter(|_| i.role.is_none())?;
            (old != &i.chosen.name).then(|| Change {
                interface: i.interface.clone(),
                from: old.clone(),
                to: i.chosen.name.clone(),
                reason: i.chosen.reason.clone(),
            })
        })
        .collect()
}

/// Checks `change` end to end: builds the crate of `w` twice, with the incumbent and with the
/// challenger for its interface (every other choice as `build` now makes it), runs both on
/// synthetic weights at the workload's typical request in interleaved rounds (every other
/// round in reverse order), and judges them by the flip rule.
fn confirm(
    project: &Project,
    w: &Workload,
    path: &Path,
    crate_dir: &Path,
    change: &Change,
    host: &Host,
    rounds: usize,
) -> Result<Confirmation, Error> {
    let dir = bench_dir(project).join("confirm").join(&w.name);
    let target = crates_target_dir(project);
    let mut binaries = Vec::new();
    let mut imps = Vec::new();
    for name in [&change.from, &change.to] {
        let forced = [(change.interface.clone(), name.clone())].into();
        let mut plan = project.plan_forced(w, path, crate_dir, forced)?;
        let chosen = plan.interface(&change.interface).map(|i| i.chosen.name.clone());
        if chosen.as_deref() != Some(name.as_str()) {
            return Err(Error::Refused(format!(
                "cannot build {} with {} {name} to check the flip: it is not a valid competitor",
                w.name, change.interface
            )));
        }
        let element = plan.interface(&change.interface).and_then(|i| i.element.clone());
        let imp = project
            .registry
            .implementation(&change.interface, name, element.as_deref())
            .ok_or_else(|| Error::Refused(format!("{} {name} is not in the registry", change.interface)))?;
        imps.push(imp.clone());
        // Packages in one target folder need names of their own. A crate's folder is named by
        // the choice it was built for, so that a later check of the same choices (the way back,
        // `--verify` after a flip's check) finds it built.
        plan.name = format!("{}-{}-{name}", w.name, change.interface.replace('_', "-"));
        let output = project.emit(&plan)?;
        let out = dir.join(format!("{}-{name}", change.interface));
        crate::write::write(&out, &output, true)?;
        seed_lock(project, &out)?;
        binaries.push(build_release(&out, &target, &plan.name, "the crate", "")?);
    }
    let model = dir.join("model");
    if !model.join("model.safetensors").is_file() || !model.join("config.json").is_file() {
        crate::synth::write_model_dir(w, &model, 1)?;
    }
    // The typical request: a prompt of ids and the decode steps, or a batch of sentences of
    // the synthetic tokenizer's words (`w5`, `w6`, ...).
    let time = |exe: &Path| -> Result<u64, Error> {
        match &w.request {
            crate::workload::Request::Decoder(request) => {
                let vocab = w.llama().vocab_size;
                let prompt_len = request.typical_prompt_len.min(request.max_seq_len.saturating_sub(1)).max(1);
                let ids: Vec<String> = (0..prompt_len)
                    .map(|i| (1 + (i * 7919) % vocab.saturating_sub(1).max(1)).to_string())
                    .collect();
                time_request(
                    exe,
                    &model,
                    &ids.join(","),
                    request.typical_decode_len.max(1),
                    request.max_batch,
                )
            }
            crate::workload::Request::Encoder(request) => {
                let words = w.bert().vocab_size.saturating_sub(5).max(1);
                let sentences: Vec<String> = (0..request.typical_batch.max(1))
                    .map(|s| {
                        (0..request.typical_seq_len.saturating_sub(2).max(1))
                            .map(|i| format!("w{}", 5 + (s * 31 + i * 7919) % words))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .collect();
                time_encode(exe, &model, &sentences)
            }
        }
    };
    let mut times: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            times[side].push(time(&binaries[side])?);
        }
    }
    let verdict = rankings::judge_rounds(&times[1], &times[0]);
    let registry = &project.registry;
    let evidence =
        rankings::evidence(&project.rankings, registry, &change.interface, &[&imps[0], &imps[1]], w);
    let kernel_ratio = match (evidence[0].fresh_distribution(), evidence[1].fresh_distribution()) {
        (Some(from), Some(to)) if from.median_ns > 0.0 => to.median_ns / from.median_ns,
        _ => 0.0,
    };
    let [from_rounds_ns, to_rounds_ns] = times;
    Ok(Confirmation {
        interface: change.interface.clone(),
        shapes: rankings::shapes_signature(w),
        from: change.from.clone(),
        from_source_sha256: rankings::measured_source_sha256(&imps[0], registry),
        to: change.to.clone(),
        to_source_sha256: rankings::measured_source_sha256(&imps[1], registry),
        cpu: host.cpu.clone(),
        cores: host.cores,
        rustc: host.rustc.clone(),
        measured_at: now_utc(),
        confirmed: verdict.beats,
        kernel_ratio,
        crate_ratio: verdict.ratio,
        margin: verdict.margin,
        from_rounds_ns,
        to_rounds_ns,
    })
}

/// The JSON report of the crate binary `exe` on `model`, given the prompt's arguments
/// (`--prompt` or `--prompt-ids` and its value, and any others) and `decode_len` tokens at most;
/// `weights` names the weights in an error.
fn run_json(
    exe: &Path,
    model: &Path,
    prompt: &[&str],
    decode_len: usize,
    weights: &str,
) -> Result<serde_json::Value, Error> {
    let out = Command::new(exe)
        .arg("--model")
        .arg(model)
        .args(prompt)
        .args(["--max-tokens", &decode_len.to_string(), "--json"])
        .output()
        .map_err(|e| Error::Refused(format!("cannot run {}: {e}", exe.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let report: Option<serde_json::Value> = text.lines().last().and_then(|l| serde_json::from_str(l).ok());
    match (report, out.status.success()) {
        (Some(report), true) => Ok(report),
        _ => Err(Error::Refused(format!(
            "{} failed on {weights}: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        ))),
    }
}

/// Nanoseconds of one call of an encoder's crate binary `exe` on `model` with `sentences`, as
/// it reports them (tokenizing and loading left out).
fn time_encode(exe: &Path, model: &Path, sentences: &[String]) -> Result<u64, Error> {
    let mut command = Command::new(exe);
    command.arg("--model").arg(model).arg("--json");
    for sentence in sentences {
        command.args(["--text", sentence]);
    }
    let out = command.output().map_err(|e| Error::Refused(format!("cannot run {}: {e}", exe.display())))?;
    let report: Option<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().last().and_then(|l| serde_json::from_str(l).ok());
    match (report.and_then(|r| r["encode_ms"].as_f64()), out.status.success()) {
        (Some(ms), true) => Ok((ms * 1e6).round() as u64),
        _ => Err(Error::Refused(format!(
            "{} failed on synthetic weights: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        ))),
    }
}

/// Nanoseconds of the typical request of the crate binary `exe` on `model`: its prefill of the
/// prompt `ids` plus `decode_len` decode steps at the time per step it reports (a synthetic
/// model may stop early at its end-of-sequence token). A batched crate (`batch` above 1) runs
/// `batch` copies of it as one batch (`--batch`): their prefills one after another, then the
/// decode steps of the whole batch.
fn time_request(exe: &Path, model: &Path, ids: &str, decode_len: usize, batch: usize) -> Result<u64, Error> {
    let copies = batch.to_string();
    let mut args = vec!["--prompt-ids", ids];
    if batch > 1 {
        args.extend(["--batch", &copies]);
    }
    let report = run_json(exe, model, &args, decode_len, "synthetic weights")?;
    let ms = |key: &str| report[key].as_f64().unwrap_or(0.0);
    // a batch reports its steps; one sequence, its tokens (one more than its steps)
    let steps = report["decode_steps"]
        .as_u64()
        .map_or_else(|| report["generated_ids"].as_array().map_or(0, Vec::len), |s| s as usize)
        .max(1);
    let per_step = ms("decode_ms") / steps as f64;
    Ok(((ms("prefill_ms") + per_step * decode_len as f64) * 1e6).round() as u64)
}

impl Report {
    /// The text `monogen bench` prints.
    pub fn render(&self) -> String {
        use crate::explain::slowest;
        use crate::plan::human_ns;
        use crate::workload::Request;
        let h = &self.hardware;
        let mut s = format!("{} on {} ({}, {} cores, {})\n", self.workload, h.class, h.cpu, h.cores, h.rustc);
        match &self.request {
            Request::Decoder(r) => s.push_str(&format!(
                "  time per typical request: one prefill of {} tokens and {} decode steps\n",
                r.typical_prompt_len.min(r.max_seq_len),
                r.typical_decode_len
            )),
            Request::Encoder(r) => s.push_str(&format!(
                "  time per typical request: one call on {} sentence(s) of {} tokens\n",
                r.typical_batch, r.typical_seq_len
            )),
        }
        let per_load = self.request.requests_per_load();
        for m in &self.measurements {
            s.push_str(&format!("\n{}\n", m.interface));
            let median = |o: &Outcome| match o.result {
                Measured::Ok { median_ns, .. } => median_ns,
                _ => f64::INFINITY,
            };
            // By time per request, with the share of the load where the workload counts it.
            let charged = |o: &Outcome| match (&o.result, per_load) {
                (Measured::Ok { median_ns, load_ns: Some(load), .. }, Some(n)) => median_ns + load / n as f64,
                _ => median(o),
            };
            let mut mine: Vec<&Outcome> =
                self.results.iter().filter(|o| o.interface == m.interface).collect();
            mine.sort_by(|a, b| charged(a).total_cmp(&charged(b)));
            let reference_median = mine.iter().find(|o| o.implementation == m.reference).map(|o| median(o));
            for o in mine {
                let mark = if o.implementation == m.chosen { "*" } else { " " };
                let line = match &o.result {
                    Measured::Ok { median_ns, p90_ns, samples, load_ns, load_max_ns, .. } => {
                        let ratio = reference_median
                            .filter(|r| r.is_finite() && o.implementation != m.reference)
                            .map(|r| format!(", {:.2}x the reference's speed", r / median_ns))
                            .unwrap_or_default();
                        let counted = match per_load {
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
                    Measured::Failed { reason } => format!("FAILED against the reference: {reason}"),
                    Measured::Skipped { reason } => format!("skipped: {reason}"),
                };
                s.push_str(&format!(" {mark} {:<20} {line}\n", o.implementation));
            }
        }
        for interface in &self.untimed {
            s.push_str(&format!(
                "\n{interface}\n   not measured: one competing implementation, and no pass in the benchmark template to time it\n"
            ));
        }
        s.push('\n');
        let class = &h.class;
        let rankings = &self.rankings_shown;
        if self.dry_run {
            s.push_str(&format!("dry run: {rankings}/ left unchanged\n"));
        } else if self.rankings_written.is_empty() {
            s.push_str(&format!("{rankings}/{class}/ unchanged\n"));
        } else {
            s.push_str(&format!("wrote {}\n", self.rankings_written.join(", ")));
            s.push_str(&format!(
                "  {rankings}/ is now modified in the working tree: commit it with the crates it regenerates, or `git checkout {rankings}/` to drop these measurements\n",
            ));
        }
        let shown = crate::shown(&self.path);
        let build = match &self.crate_dir {
            Some(dir) => format!("monogen build --crate {}", crate::shown(dir)),
            None => format!("monogen build {shown}"),
        };
        if let Some(other) = &self.workload_hardware {
            let named = if other == "none" {
                "names no hardware class (its kernels are chosen by declared priority)".to_string()
            } else {
                format!(
                    "is tuned for hardware class `{other}`, so `build` chooses its kernels from rankings/{other}/"
                )
            };
            s.push_str(&format!(
                "{shown} {named}; these measurements are this machine's (`{class}`). A workload with `hardware = \"{class}\"` in its [target] (`monogen init --hardware this`) uses them; * marks what it would choose\n"
            ));
            return s;
        }
        let checked = |c: &rankings::Confirmation, when: String| {
            let (from, to) = c.medians_ns();
            format!(
                "{}: {} → {} checked end to end{when} (the crate built both ways, {} rounds on synthetic weights): {} per request against {} ({:.3}x round by round, margin {:.0}%; the kernels {:.3}x)",
                c.interface,
                c.from,
                c.to,
                c.to_rounds_ns.len(),
                crate::plan::human_ns(to),
                crate::plan::human_ns(from),
                c.crate_ratio,
                100.0 * c.margin,
                c.kernel_ratio,
            )
        };
        for c in &self.confirmations {
            let verdict =
                if c.confirmed { "confirmed" } else { "not confirmed, so the crate keeps its choice" };
            s.push_str(&format!("{}: {verdict}\n", checked(c, String::new())));
        }
        for c in &self.on_record {
            s.push_str(&format!(
                "{}: on record for these sources, not timed again (`--recheck` times it again)\n",
                checked(c, format!(" on {}", c.measured_at))
            ));
        }
        if !self.has_crate {
            let folder = match &self.crate_dir {
                Some(dir) => crate::shown(dir),
                None => "generated/".to_string(),
            };
            s.push_str(&format!(
                "{folder} holds no crate of {} to compare with: * marks what `{build}` will choose\n",
                self.workload
            ));
        } else if self.choices_changed.is_empty() {
            s.push_str(&format!("no choice of {} changes (* marks the choices)\n", self.workload));
        } else {
            for c in &self.choices_changed {
                s.push_str(&format!("{}: {} → {} ({})\n", c.interface, c.from, c.to, c.reason));
            }
            s.push_str(&format!("run `{build}` to regenerate the crate\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_986_245), "2026-11-29T21:04:05Z");
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let values: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(median_p90(&values), (5.5, 9.0));
        assert_eq!(median_p90(&[3.0]), (3.0, 3.0));
        assert_eq!(median_p90(&[]), (0.0, 0.0));
    }

    #[test]
    fn a_request_is_one_prefill_and_every_decode_step() {
        let raw = RawResult {
            interface: "matmul".into(),
            implementation: "x".into(),
            status: "ok".into(),
            reason: None,
            decode_steps: 10,
            decode_rows: 1,
            prefill_ns: vec![100.0, 300.0, 200.0],
            decode_ns: vec![1.0, 3.0, 2.0],
            load_ns: Some(5e6),
            load_max_ns: Some(6e6),
        };
        match summarize(&raw, "1.0.0").result {
            Measured::Ok {
                median_ns,
                p90_ns,
                samples,
                prefill_median_ns,
                decode_median_ns,
                rounds_ns,
                load_ns,
                load_max_ns,
            } => {
                assert_eq!(load_ns, Some(5e6), "the packing's time passes through, not added to a request");
                assert_eq!(load_max_ns, Some(6e6), "and its slowest");
                assert_eq!((median_ns, p90_ns, samples), (220.0, 330.0, 3));
                assert_eq!((prefill_median_ns, decode_median_ns), (200.0, 2.0));
                assert_eq!(rounds_ns, [110.0, 330.0, 220.0], "in the order of the rounds");
            }
            other => panic!("{other:?}"),
        }
        let failed = RawResult { status: "failed".into(), reason: Some("wrong".into()), ..raw };
        assert!(matches!(summarize(&failed, "1").result, Measured::Failed { reason } if reason == "wrong"));
    }

    #[test]
    fn a_batched_step_is_shared_by_the_sequences_it_serves() {
        let raw = RawResult {
            interface: "matmul".into(),
            implementation: "x".into(),
            status: "ok".into(),
            reason: None,
            decode_steps: 10,
            decode_rows: 16,
            prefill_ns: vec![100.0, 300.0, 200.0],
            decode_ns: vec![16.0, 48.0, 32.0],
            load_ns: None,
            load_max_ns: None,
        };
        let Measured::Ok { median_ns, decode_median_ns, rounds_ns, .. } = summarize(&raw, "1.0.0").result
        else {
            panic!("ok")
        };
        assert_eq!(decode_median_ns, 2.0, "a sequence's share of a step of 16");
        assert_eq!(rounds_ns, [110.0, 330.0, 220.0]);
        assert_eq!(median_ns, 220.0);
    }
}
