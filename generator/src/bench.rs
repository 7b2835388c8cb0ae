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
use crate::rankings::{self, BUILD_FLAGS, Record, Status, median_p90};
use crate::registry::Registry;
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
        /// Per request: one prefill pass plus `decode_steps` decode steps.
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
/// the interface: each round's prefill pass plus `decode_steps` times its decode step.
pub fn summarize(raw: &RawResult, version: &str) -> Outcome {
    let result = match raw.status.as_str() {
        "ok" => {
            let requests: Vec<f64> = raw
                .prefill_ns
                .iter()
                .zip(&raw.decode_ns)
                .map(|(p, d)| p + raw.decode_steps as f64 * d)
                .collect();
            let (median_ns, p90_ns) = median_p90(&requests);
            Measured::Ok {
                median_ns,
                p90_ns,
                samples: requests.len(),
                prefill_median_ns: median_p90(&raw.prefill_ns).0,
                decode_median_ns: median_p90(&raw.decode_ns).0,
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

/// The records of `outcomes` (skipped candidates have none), keyed by this machine.
pub fn records(
    outcomes: &[Outcome],
    plan: &Plan,
    registry: &Registry,
    host: &Host,
    measured_at: &str,
) -> BTreeMap<String, Vec<Record>> {
    let shapes = rankings::shapes_signature(&plan.workload);
    let mut out: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for o in outcomes {
        let Some(imp) = registry.implementation(&o.interface, &o.implementation) else { continue };
        let base = Record {
            implementation: o.implementation.clone(),
            version: imp.version.clone(),
            source_sha256: rankings::measured_source_sha256(imp, registry),
            shapes: shapes.clone(),
            cpu: host.cpu.clone(),
            cores: host.cores,
            cpu_features: host.cpu_features.clone(),
            rustc: host.rustc.clone(),
            build_flags: BUILD_FLAGS.to_string(),
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

/// Writes the harness crate of `plan` under `dir/<workload>/` (files that did not change are
/// left alone, so cargo rebuilds only what it must); returns its folder and crate name.
pub fn write_harness(project: &Project, plan: &Plan, dir: &Path) -> Result<(PathBuf, String), Error> {
    let (output, name) = harness::emit(plan, &project.registry, &project.templates)?;
    let crate_dir = dir.join(&plan.workload.name);
    let src = crate_dir.join("src");
    if src.exists() {
        // Kernels of candidates that no longer compete must not linger.
        for entry in walk(&src)? {
            let rel = entry.strip_prefix(&crate_dir).unwrap_or(&entry).to_path_buf();
            if !output.files.contains_key(&rel) {
                std::fs::remove_file(&entry).map_err(|e| Error::io(&entry, e))?;
            }
        }
    }
    for (rel, text) in &output.files {
        let path = crate_dir.join(rel);
        if std::fs::read_to_string(&path).is_ok_and(|old| &old == text) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    }
    Ok((crate_dir, name))
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))?.flatten() {
            let path = entry.path();
            if path.is_dir() { stack.push(path) } else { out.push(path) }
        }
    }
    Ok(out)
}

/// Compiles the harness in `crate_dir` (release) with its target folder at `target_dir`;
/// returns the executable.
pub fn build_harness(crate_dir: &Path, target_dir: &Path, name: &str) -> Result<PathBuf, Error> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(crate_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .map_err(|e| Error::Refused(format!("cannot run `{cargo}` to build the benchmark harness: {e}")))?;
    if !out.status.success() {
        return Err(Error::Refused(format!(
            "the benchmark harness in {} does not compile (an implementation's source is broken?):\n{}",
            crate_dir.display(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        )));
    }
    let exe = target_dir.join("release").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !exe.exists() {
        return Err(Error::Refused(format!("cargo built the harness, but {} is missing", exe.display())));
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
}
