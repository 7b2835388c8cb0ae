//! The ranking database: measurements of implementations, kept in the repository.
//!
//! `rankings/<hardware class>/<interface>.toml` holds one `[[record]]` per implementation
//! and shape signature, sorted, so that a re-measurement changes the lines of the records it
//! replaces and two branches that measured different workloads merge without conflict. A
//! record's key is everything that can change its result (see [`Record`]); the functions
//! here decide, from the repository's contents alone, which records are fresh and whether a
//! difference between two measurements is beyond their noise ([`beats`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::diagnostics::Diagnostic;
use crate::registry::{Implementation, Registry, sha256_hex};
use crate::workload::{Request, Workload};

/// The folder of the database, under the project root.
pub const RANKINGS_DIR: &str = "rankings";

/// How the benchmark harness is compiled and how it measures. A record made with other
/// compiler flags is stale. Change `harness=` whenever the harness's method of measurement
/// changes: the candidates of an interface are then compared only among records of the
/// newest one's version (at a workload's shapes, as for the machine and toolchain), so that one
/// measured again under the new method makes the rest of them stale. A class whose records are
/// all of an older version keeps them until it is measured again.
///
/// Version 2: every timing starts after one untimed run of the same candidate's pass, and a
/// matmul pass holds its weights as a crate's loader places them (huge pages, cache lines).
/// Version 3: that untimed run precedes every pass of less than a second, not only those of
/// less than 50 ms, so that a prefill pass too is timed with the caches as the candidate's own
/// pass left them, not as the candidate before it did.
pub const BUILD_FLAGS: &str =
    "harness=3 opt-level=3 codegen-units=1 lto=thin panic=unwind debug-assertions=off";

/// The leading `harness=N` word of `flags` (empty if there is none) and the compiler's part.
fn split_flags(flags: &str) -> (&str, &str) {
    let (first, rest) = flags.split_once(' ').unwrap_or((flags, ""));
    if first.starts_with("harness=") { (first, rest) } else { ("", flags) }
}

/// The smallest relative difference that counts as a real one, however quiet the samples.
pub const MIN_MARGIN: f64 = 0.03;

/// The largest noise margin: medians more than twice apart always count as a real difference.
/// A slow tail reaching past twice the median is a disturbance of the machine (a preempted
/// sample), not the code's own variation; and with few samples the 90th percentile is a single
/// sample, so one such disturbance must not hide a 7x faster kernel.
pub const MAX_MARGIN: f64 = 1.0;

/// One measurement of one implementation at one workload's shapes on one machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    // The key: what the result depends on.
    pub implementation: String,
    /// The element type it was measured at, for an implementation whose folder serves several
    /// ([`Implementation::several_elements`]); absent for the others, whose name says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<String>,
    pub version: String,
    /// [`measured_source_sha256`]: the kernel and the shared modules it uses.
    pub source_sha256: String,
    /// [`shapes_signature`] of the workloads it applies to.
    pub shapes: String,
    /// The CPU model, core count and features of the machine.
    pub cpu: String,
    pub cores: usize,
    pub cpu_features: Vec<String>,
    /// `rustc --version`.
    pub rustc: String,
    /// [`BUILD_FLAGS`] when it was measured.
    pub build_flags: String,
    /// [`harness_sha256`] of the harness it was measured by. Absent from records made before
    /// it was kept, for which `harness=N` in `build_flags` stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness_sha256: Option<String>,
    /// The crates its kernel depends on, dependencies of dependencies included, each as
    /// `name version` from the lock file the harness was built with, sorted ([`CargoLock::closure`];
    /// empty for a kernel that depends on none). Absent from records made before they were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<Vec<String>>,
    // The result.
    /// UTC, RFC 3339.
    pub measured_at: String,
    pub status: Status,
    /// Why the output did not match the reference's (status `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Nanoseconds of one typical request spent in this interface: one prefill pass of the
    /// typical prompt plus `typical_decode_len` decode steps. Median and 90th percentile.
    #[serde(default)]
    pub median_ns: u64,
    #[serde(default)]
    pub p90_ns: u64,
    #[serde(default)]
    pub samples: usize,
    /// Medians of the parts: one prefill pass, one decode step (a sequence's share of a step
    /// of `max_batch` sequences, where the workload batches).
    #[serde(default)]
    pub prefill_median_ns: u64,
    #[serde(default)]
    pub decode_median_ns: u64,
    /// Nanoseconds the implementation adds to a crate's load: its packing of every matrix of the
    /// model, on one thread, as the crate packs them (absent for an implementation that uses the
    /// weights as the loader gives them, and in records made before it was measured). Counted
    /// only where the workload says how many requests a load serves
    /// (`request.requests_per_load`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_ns: Option<u64>,
    /// `load_ns` with each matrix's slowest of its three packings in place of its median: how
    /// far a pause of the machine, or the first packing's first touches of fresh memory, may
    /// have moved the packing's time. Absent from records made before it was kept, where
    /// `load_ns` is taken as exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_max_ns: Option<u64>,
    /// Nanoseconds of one typical request in each timed round, in the order of the rounds.
    /// Every round times every candidate of the interface once, so two records of one run
    /// (the same `measured_at`) compare round by round ([`judge`]). Absent from records made
    /// before it was kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds_ns: Vec<u64>,
    /// The share of `load_ns` counted in `median_ns`, `p90_ns` and `rounds_ns`: `load_ns /
    /// requests_per_load`, added by [`evidence`] where a workload counts the load
    /// ([`Record::with_load_counted`]). Never stored in the database.
    #[serde(default, skip_deserializing, skip_serializing_if = "is_zero")]
    pub load_counted_ns: u64,
    /// The share of `load_max_ns` counted in `p90_ns` in place of `load_counted_ns` (at least
    /// that). Never stored in the database.
    #[serde(default, skip_deserializing, skip_serializing_if = "is_zero")]
    pub load_counted_max_ns: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Matched the reference and was timed.
    Ok,
    /// Did not match the reference: never ranked.
    Failed,
}

impl Record {
    /// Whether this record is of `imp`: its name, and its element type where its folder serves
    /// several.
    pub fn measures(&self, imp: &Implementation) -> bool {
        self.implementation == imp.name && self.element == element_key(imp)
    }

    pub fn distribution(&self) -> Distribution {
        Distribution { median_ns: self.median_ns as f64, p90_ns: self.p90_ns as f64, samples: self.samples }
    }

    /// This record with each request charged `load_ns / requests_per_load` (rounded up): the
    /// time of a request where every process serves `requests_per_load` requests from one load
    /// of the model from its checkpoint. An implementation that does not pack has nothing to add.
    /// The median and every round take that share; the 90th percentile takes the share of
    /// `load_max_ns`, so that the packing's own noise widens the spread that the flip rule asks
    /// a challenger to clear.
    pub fn with_load_counted(&self, requests_per_load: u64) -> Record {
        let n = requests_per_load.max(1);
        let load = self.load_ns.unwrap_or(0);
        let share = load.div_ceil(n);
        let share_max = self.load_max_ns.unwrap_or(load).max(load).div_ceil(n);
        Record {
            median_ns: self.median_ns + share,
            p90_ns: self.p90_ns + share_max,
            rounds_ns: self.rounds_ns.iter().map(|t| t + share).collect(),
            load_counted_ns: self.load_counted_ns + share,
            load_counted_max_ns: self.load_counted_max_ns.max(self.load_counted_ns) + share_max,
            ..self.clone()
        }
    }

    /// How far the slowest packings could move this record's charged median, relative to it:
    /// `(load_counted_max_ns − load_counted_ns) / median_ns` (0 where no load is counted).
    pub fn load_spread(&self) -> f64 {
        let extra = self.load_counted_max_ns.saturating_sub(self.load_counted_ns);
        if self.median_ns == 0 { 0.0 } else { extra as f64 / self.median_ns as f64 }
    }
}

/// A timing distribution: what the flip rule looks at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    pub median_ns: f64,
    pub p90_ns: f64,
    pub samples: usize,
}

impl Distribution {
    /// How far the slow tail reaches above the median, relative to it.
    pub fn relative_spread(&self) -> f64 {
        if self.median_ns <= 0.0 { 0.0 } else { ((self.p90_ns - self.median_ns) / self.median_ns).max(0.0) }
    }
}

/// The noise margin of a comparison: the larger relative spread of the two, at least
/// [`MIN_MARGIN`] and at most [`MAX_MARGIN`].
pub fn noise_margin(a: &Distribution, b: &Distribution) -> f64 {
    MIN_MARGIN.max(a.relative_spread()).max(b.relative_spread()).min(MAX_MARGIN)
}

/// The flip rule: `challenger` replaces `incumbent` only if its median, raised by the noise
/// margin, is still below the incumbent's median. A difference inside the noise keeps the
/// incumbent, so two measurements of equally fast code never flip a choice back and forth.
pub fn beats(challenger: &Distribution, incumbent: &Distribution) -> bool {
    challenger.median_ns * (1.0 + noise_margin(challenger, incumbent)) < incumbent.median_ns
}

/// What the flip rule concluded about a challenger against the incumbent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Whether the challenger replaces the incumbent.
    pub beats: bool,
    /// The challenger's time over the incumbent's: the median of the rounds' ratios when the
    /// two were measured round by round in one run, else the ratio of the medians.
    pub ratio: f64,
    /// The noise margin the ratio had to clear.
    pub margin: f64,
    /// The rounds compared pairwise (0: the medians were compared).
    pub paired_rounds: usize,
}

/// The per-round ratios `challenger / incumbent`, when the two records come from one run of
/// `monogen bench` (the same `measured_at` and as many rounds, every one timed).
pub fn round_ratios(challenger: &Record, incumbent: &Record) -> Option<Vec<f64>> {
    let (c, i) = (&challenger.rounds_ns, &incumbent.rounds_ns);
    let same_run = challenger.measured_at == incumbent.measured_at && c.len() == i.len() && !c.is_empty();
    (same_run && i.iter().all(|&t| t > 0))
        .then(|| c.iter().zip(i).map(|(&c, &i)| c as f64 / i as f64).collect())
}

/// The flip rule on two records ([`beats`] on their medians when they cannot be paired).
///
/// Rounds are interleaved, so a slow stretch of a shared machine (its memory bandwidth moves by
/// a third within seconds) that lasts through a round slows the round's candidates alike: the
/// ratio of two candidates' times in one round keeps the difference of the code without that
/// part of the machine's noise. With `r` the rounds' ratios, the challenger beats the incumbent when
/// `median(r) · (1 + margin) < 1`, the margin being the ratios' own spread, `(p90(r) −
/// median(r)) / median(r)`, between [`MIN_MARGIN`] and [`MAX_MARGIN`]: the rule of [`beats`],
/// applied to the ratio instead of to each median.
///
/// Every round of a record charged with its packing at load carries the same share of one
/// measurement of that packing, which the rounds' ratios cannot show the noise of: each side's
/// [`Record::load_spread`] is added to the margin (before the cap at [`MAX_MARGIN`]).
pub fn judge(challenger: &Record, incumbent: &Record) -> Verdict {
    if let Some(ratios) = round_ratios(challenger, incumbent) {
        let (median, p90) = median_p90(&ratios);
        let spread = if median > 0.0 { ((p90 - median) / median).max(0.0) } else { 0.0 };
        let margin =
            (MIN_MARGIN.max(spread) + challenger.load_spread() + incumbent.load_spread()).min(MAX_MARGIN);
        return Verdict {
            beats: median * (1.0 + margin) < 1.0,
            ratio: median,
            margin,
            paired_rounds: ratios.len(),
        };
    }
    let (c, i) = (challenger.distribution(), incumbent.distribution());
    let ratio = if i.median_ns > 0.0 { c.median_ns / i.median_ns } else { 1.0 };
    Verdict { beats: beats(&c, &i), ratio, margin: noise_margin(&c, &i), paired_rounds: 0 }
}

/// The flip rule on two series of times measured round by round (one crate against another,
/// end to end): `challenger`'s round over `incumbent`'s, with [`judge`]'s margin.
pub fn judge_rounds(challenger: &[u64], incumbent: &[u64]) -> Verdict {
    let ratios: Vec<f64> = challenger
        .iter()
        .zip(incumbent)
        .filter(|(_, i)| **i > 0)
        .map(|(&c, &i)| c as f64 / i as f64)
        .collect();
    if ratios.is_empty() {
        return Verdict { beats: false, ratio: 1.0, margin: MAX_MARGIN, paired_rounds: 0 };
    }
    let (median, p90) = median_p90(&ratios);
    let spread = if median > 0.0 { ((p90 - median) / median).max(0.0) } else { 0.0 };
    let margin = MIN_MARGIN.max(spread).min(MAX_MARGIN);
    Verdict { beats: median * (1.0 + margin) < 1.0, ratio: median, margin, paired_rounds: ratios.len() }
}

/// The median and 90th percentile (nearest rank) of `values`.
pub fn median_p90(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    let n = sorted.len();
    let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
    (median, at(0.9))
}

/// What a fresh record must have been measured with, beyond its implementation's version and
/// source: what the repository itself says about the harness, the kernels' dependencies and
/// the toolchain, so that `check` decides from files alone. Empty (nothing known, nothing
/// compared) for a database read on its own.
#[derive(Debug, Clone, Default)]
pub struct Current {
    /// Per architecture (`llama`, `bert`), [`harness_sha256`] of the templates now.
    pub harness_sha256: BTreeMap<String, String>,
    /// The lock file harnesses are built with: the monogen repository's `Cargo.lock`.
    pub lock: Option<CargoLock>,
    /// The Rust version that `rust-toolchain.toml` pins beside the database (in the folder
    /// that holds it), and that file as shown: records of another rustc are stale.
    pub rustc_pin: Option<(String, String)>,
}

impl Current {
    /// Reads the harness templates and `Cargo.lock` under `root`, and the toolchain pin in the
    /// folder that holds `rankings_dir`.
    pub fn read(root: &Path, rankings_dir: &Path) -> Result<Current, Error> {
        let mut current = Current::default();
        for arch in ["llama", "bert"] {
            if let Some(sha) = harness_sha256(root, arch)? {
                current.harness_sha256.insert(arch.to_string(), sha);
            }
        }
        let lock = root.join("Cargo.lock");
        if lock.is_file() {
            current.lock = Some(CargoLock::read(&lock)?);
        }
        let holder = rankings_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        for name in ["rust-toolchain.toml", "rust-toolchain"] {
            let file = holder.join(name);
            let Ok(text) = std::fs::read_to_string(&file) else { continue };
            if let Some(version) = pinned_rust_version(&text) {
                current.rustc_pin = Some((version, crate::shown(&file)));
            }
            break;
        }
        Ok(current)
    }
}

/// The Rust release a toolchain file pins (`channel = "1.95.0"` under `[toolchain]`, or a
/// legacy one-line file), or `None` for a channel such as `stable` that names no release.
pub fn pinned_rust_version(text: &str) -> Option<String> {
    let channel = match toml::from_str::<toml::Table>(text) {
        Ok(table) => table.get("toolchain")?.get("channel")?.as_str()?.to_string(),
        Err(_) => text.trim().to_string(),
    };
    let is_release = channel.split('.').count() >= 2 && channel.split('.').all(|p| p.parse::<u32>().is_ok());
    is_release.then_some(channel)
}

/// The Rust release of a `rustc --version` line (`rustc 1.95.0 (59807616e 2026-04-14)` → `1.95.0`).
pub fn rustc_release(version: &str) -> &str {
    version.split_whitespace().nth(1).unwrap_or(version)
}

/// sha256 of the benchmark harness an architecture's records are measured by: its crate
/// template, the shared harness and the architecture's passes (`templates/bench/`); `None`
/// where the architecture has no passes there.
pub fn harness_sha256(root: &Path, arch: &str) -> Result<Option<String>, Error> {
    let dir = root.join("templates").join("bench");
    let own = dir.join(format!("{arch}.rs"));
    if !own.is_file() {
        return Ok(None);
    }
    let mut text = String::new();
    for path in [dir.join("Cargo.toml.j2"), dir.join("harness.rs"), own] {
        let body = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        text.push_str(&format!(
            "{} {}\n",
            path.file_name().unwrap_or_default().to_string_lossy(),
            sha256_hex(&body)
        ));
    }
    Ok(Some(sha256_hex(text.as_bytes())))
}

/// A `Cargo.lock`: each package's version and dependencies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CargoLock {
    /// name → (version, dependencies as the lock writes them: `name` or `name version`).
    packages: BTreeMap<String, Vec<(String, Vec<String>)>>,
}

impl CargoLock {
    pub fn read(path: &Path) -> Result<CargoLock, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        CargoLock::parse(&text)
            .map_err(|e| Error::Refused(format!("{} cannot be read: {e}", crate::shown(path))))
    }

    pub fn parse(text: &str) -> Result<CargoLock, String> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            package: Vec<Package>,
        }
        #[derive(Deserialize)]
        struct Package {
            name: String,
            version: String,
            #[serde(default)]
            dependencies: Vec<String>,
        }
        let file: File = toml::from_str(text).map_err(|e| e.message().trim().to_string())?;
        let mut packages: BTreeMap<String, Vec<(String, Vec<String>)>> = BTreeMap::new();
        for p in file.package {
            packages.entry(p.name).or_default().push((p.version, p.dependencies));
        }
        Ok(CargoLock { packages })
    }

    /// `roots` (crate names, as manifests list them) and everything they depend on, each as
    /// `name version`, sorted. A root the lock lacks is listed as `name ?`; where the lock has
    /// several versions of a root, the newest.
    pub fn closure(&self, roots: &[String]) -> Vec<String> {
        let mut seen = std::collections::BTreeSet::new();
        let mut stack: Vec<(String, Option<String>)> = roots.iter().map(|r| (r.clone(), None)).collect();
        while let Some((name, version)) = stack.pop() {
            let Some(versions) = self.packages.get(&name) else {
                seen.insert(format!("{name} ?"));
                continue;
            };
            let found = match &version {
                Some(v) => versions.iter().find(|(have, _)| have == v),
                None => versions.iter().max_by(|a, b| compare_versions(&a.0, &b.0)),
            };
            let Some((v, deps)) = found else {
                seen.insert(format!("{name} ?"));
                continue;
            };
            if seen.insert(format!("{name} {v}")) {
                for dep in deps {
                    let mut words = dep.split_whitespace();
                    let dep_name = words.next().unwrap_or_default().to_string();
                    stack.push((dep_name, words.next().map(str::to_string)));
                }
            }
        }
        seen.into_iter().collect()
    }
}

fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |v: &str| -> Vec<u64> { v.split(['.', '-', '+']).map(|p| p.parse().unwrap_or(0)).collect() };
    parts(a).cmp(&parts(b))
}

/// What differs between two dependency lists, as `name a → b`, `+name b` or `-name a`.
fn dependency_changes(was: &[String], now: &[String]) -> Vec<String> {
    let split = |list: &[String]| -> BTreeMap<String, String> {
        list.iter().filter_map(|e| e.split_once(' ').map(|(n, v)| (n.to_string(), v.to_string()))).collect()
    };
    let (was, now) = (split(was), split(now));
    let mut out = Vec::new();
    for (name, old) in &was {
        match now.get(name) {
            Some(new) if new != old => out.push(format!("{name} {old} → {new}")),
            Some(_) => {}
            None => out.push(format!("-{name} {old}")),
        }
    }
    for (name, new) in &now {
        if !was.contains_key(name) {
            out.push(format!("+{name} {new}"));
        }
    }
    out
}

/// The file of a class's end-to-end confirmations, beside the records of its interfaces.
pub const CONFIRMATIONS_FILE: &str = "confirmations.toml";

/// One end-to-end check of a flip that the kernels' records propose: the crate built with the
/// incumbent and with the challenger, everything else as `build` would choose, each timed on
/// synthetic weights at the workload's typical request, in interleaved rounds, and judged by
/// the flip rule ([`judge_rounds`]). A flip whose crate is not faster is not adopted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Confirmation {
    // The key.
    pub interface: String,
    /// [`shapes_signature`] of the workload whose crate was built.
    pub shapes: String,
    /// The incumbent (the crate's choice) and [`measured_source_sha256`] of it.
    pub from: String,
    pub from_source_sha256: String,
    /// The challenger the kernels' records favour, and its source hash.
    pub to: String,
    pub to_source_sha256: String,
    pub cpu: String,
    pub cores: usize,
    pub rustc: String,
    pub measured_at: String,
    // The result.
    /// Whether the crate with `to` beat the crate with `from` by the flip rule.
    pub confirmed: bool,
    /// The kernels' figure: `to`'s time over `from`'s, as their records compared.
    pub kernel_ratio: f64,
    /// The crates' figure: `to`'s time over `from`'s, the median of the rounds' ratios.
    pub crate_ratio: f64,
    /// The noise margin `crate_ratio` had to clear.
    pub margin: f64,
    /// Nanoseconds of one typical request (prefill of the typical prompt, the typical number
    /// of decode steps) of each crate, round by round.
    pub from_rounds_ns: Vec<u64>,
    pub to_rounds_ns: Vec<u64>,
}

impl Confirmation {
    /// Whether this is the check of `from` → `to` for `interface` at `shapes`, as the registry
    /// has them now.
    pub fn is_of(
        &self,
        interface: &str,
        shapes: &str,
        from: &Implementation,
        to: &Implementation,
        registry: &Registry,
    ) -> bool {
        self.interface == interface
            && self.shapes == shapes
            && self.from == from.name
            && self.to == to.name
            && self.from_source_sha256 == measured_source_sha256(from, registry)
            && self.to_source_sha256 == measured_source_sha256(to, registry)
    }

    /// The medians of the two crates' rounds.
    pub fn medians_ns(&self) -> (f64, f64) {
        let median = |v: &[u64]| median_p90(&v.iter().map(|&t| t as f64).collect::<Vec<_>>()).0;
        (median(&self.from_rounds_ns), median(&self.to_rounds_ns))
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfirmationFile {
    #[serde(default)]
    confirmation: Vec<Confirmation>,
}

/// Every record of the repository: hardware class → interface → records.
#[derive(Debug, Clone, Default)]
pub struct Rankings {
    pub classes: BTreeMap<String, BTreeMap<String, Vec<Record>>>,
    /// What a fresh record must have been measured with ([`Current::read`]).
    pub current: Current,
    /// Hardware class → its end-to-end confirmations of flips.
    pub confirmations: BTreeMap<String, Vec<Confirmation>>,
    /// Hardware class → its measurements of speculation (crate::speculation).
    pub speculation: BTreeMap<String, Vec<crate::speculation::Record>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RankingFile {
    #[serde(default)]
    record: Vec<Record>,
}

impl Rankings {
    /// Reads the database in `dir` (`rankings/` of the project unless `--rankings` names
    /// another; absent means empty).
    pub fn load(dir: &Path) -> Result<Rankings, Error> {
        let mut rankings = Rankings::default();
        let Ok(classes) = std::fs::read_dir(dir) else {
            return Ok(rankings);
        };
        let mut problems = Vec::new();
        for class in classes.flatten() {
            let class_dir = class.path();
            if !class_dir.is_dir() {
                continue;
            }
            let class_name = class.file_name().to_string_lossy().into_owned();
            // Evaluation records (`monogen eval`) live beside the classes.
            if class_name == crate::eval::QUALITY_DIR {
                continue;
            }
            let entries = std::fs::read_dir(&class_dir).map_err(|e| Error::io(&class_dir, e))?;
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_none_or(|x| x != "toml") {
                    continue;
                }
                let interface = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
                let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
                if path.file_name().is_some_and(|n| n == crate::speculation::SPECULATION_FILE) {
                    match toml::from_str::<crate::speculation::RecordFile>(&text) {
                        Ok(file) => {
                            rankings.speculation.insert(class_name.clone(), file.record);
                        }
                        Err(e) => problems.push(unreadable(&path, &text, &e)),
                    }
                    continue;
                }
                if path.file_name().is_some_and(|n| n == CONFIRMATIONS_FILE) {
                    match toml::from_str::<ConfirmationFile>(&text) {
                        Ok(file) => {
                            rankings.confirmations.insert(class_name.clone(), file.confirmation);
                        }
                        Err(e) => problems.push(unreadable(&path, &text, &e)),
                    }
                    continue;
                }
                match parse_file(&text, Path::new(&crate::shown(&path))) {
                    Ok(records) => {
                        rankings.classes.entry(class_name.clone()).or_default().insert(interface, records);
                    }
                    Err(d) => problems.push(*d),
                }
            }
        }
        if problems.is_empty() { Ok(rankings) } else { Err(Error::Diagnostics(problems)) }
    }

    /// The records of `interface` on hardware `class`.
    pub fn records(&self, class: &str, interface: &str) -> &[Record] {
        self.classes.get(class).and_then(|c| c.get(interface)).map_or(&[], Vec::as_slice)
    }

    /// Replaces the records of `interface` on `class` for `shapes` of the implementations that
    /// `measured` says a run measured (those of the workload's element type, and any no longer
    /// in the registry) with `new`, keeping the records of other shapes and of other element
    /// types: the shape signature does not tell a workload with bfloat16 activations, or a
    /// bfloat16 KV cache, from one without.
    pub fn replace(
        &mut self,
        class: &str,
        interface: &str,
        shapes: &str,
        new: Vec<Record>,
        measured: impl Fn(&Record) -> bool,
    ) {
        let records =
            self.classes.entry(class.to_string()).or_default().entry(interface.to_string()).or_default();
        records.retain(|r| r.shapes != shapes || !measured(r));
        records.extend(new);
        records.sort_by(|a, b| {
            a.shapes
                .cmp(&b.shapes)
                .then_with(|| a.implementation.cmp(&b.implementation))
                .then_with(|| a.element.cmp(&b.element))
        });
    }

    /// The confirmation of `from` → `to` for `interface` of a workload of `shapes` on `class`,
    /// if one was made with the sources the registry has now.
    pub fn confirmation(
        &self,
        class: &str,
        interface: &str,
        shapes: &str,
        from: &Implementation,
        to: &Implementation,
        registry: &Registry,
    ) -> Option<&Confirmation> {
        self.confirmations.get(class)?.iter().find(|c| c.is_of(interface, shapes, from, to, registry))
    }

    /// Adds `new` to `class`'s confirmations in place of any of the same flip at the same shapes.
    pub fn replace_confirmation(&mut self, class: &str, new: Confirmation) {
        let list = self.confirmations.entry(class.to_string()).or_default();
        list.retain(|c| {
            !(c.interface == new.interface && c.shapes == new.shapes && c.from == new.from && c.to == new.to)
        });
        list.push(new);
        list.sort_by(|a, b| {
            (&a.shapes, &a.interface, &a.from, &a.to).cmp(&(&b.shapes, &b.interface, &b.from, &b.to))
        });
    }

    /// The path (relative to the database's folder) and text of `class`'s confirmations.
    pub fn render_confirmations(&self, class: &str) -> (PathBuf, String) {
        let path = Path::new(class).join(CONFIRMATIONS_FILE);
        let file =
            ConfirmationFile { confirmation: self.confirmations.get(class).cloned().unwrap_or_default() };
        let body = toml::to_string(&file).expect("confirmations always serialize");
        let text = format!(
            "# End-to-end checks of flips on hardware class `{class}`, written by `monogen bench`: the crate\n\
             # built with the incumbent and with the challenger its kernels' records favour, each timed on\n\
             # synthetic weights. A flip whose crate is not faster is not adopted (docs/rankings.md).\n\n{body}"
        );
        (path, text)
    }

    /// The path (relative to the database's folder) and text of the file for `interface` on
    /// `class`.
    pub fn render(&self, class: &str, interface: &str) -> (PathBuf, String) {
        let path = Path::new(class).join(format!("{interface}.toml"));
        let file = RankingFile { record: self.records(class, interface).to_vec() };
        let body = toml::to_string(&file).expect("records always serialize");
        let text = format!(
            "# Measurements of `{interface}` implementations on hardware class `{class}`, written by\n\
             # `monogen bench`. One record per implementation and shape signature; a record whose key\n\
             # (version, source, shapes, machine, toolchain, build flags) no longer matches is stale.\n\
             # docs/rankings.md explains the fields and the rule that ranks them.\n\n{body}"
        );
        (path, text)
    }
}

/// The error of a database file that does not parse.
fn unreadable(path: &Path, text: &str, e: &toml::de::Error) -> Diagnostic {
    let shown = crate::shown(path);
    let mut d = Diagnostic::new(format!("{shown} cannot be read: {}", e.message().trim()))
        .in_file(Path::new(&shown), &std::sync::Arc::from(text));
    if let Some(span) = e.span() {
        d = d.primary(span, "here");
    }
    d.hint("fix the file by hand, or delete it and run `monogen bench` again")
}

fn parse_file(text: &str, shown: &Path) -> Result<Vec<Record>, Box<Diagnostic>> {
    match toml::from_str::<RankingFile>(text) {
        Ok(file) => Ok(file.record),
        Err(e) => {
            let mut d =
                Diagnostic::new(format!("{} cannot be read: {}", shown.display(), e.message().trim()))
                    .in_file(shown, &std::sync::Arc::from(text));
            if let Some(span) = e.span() {
                d = d.primary(span, "here");
            }
            Err(Box::new(d.hint("fix the file by hand, or delete it and run `monogen bench` again")))
        }
    }
}

/// The shapes that decide a measurement: everything in the workload that changes what the
/// kernels compute or how often (the model's shapes, the request pattern, threads and dtype),
/// each under its name in the workload schema (`llama hidden_size=64 … typical_prompt_len=128
/// typical_decode_len=128 threads=2 dtype=f32`).
pub fn shapes_signature(w: &Workload) -> String {
    let mut parts = vec![w.model.architecture().as_str().to_string()];
    parts.extend(w.shapes().iter().map(|(shape, value)| format!("{}={value}", shape.name())));
    match &w.request {
        Request::Decoder(r) => {
            parts.push(format!("typical_prompt_len={}", r.typical_prompt_len.min(r.max_seq_len)));
            parts.push(format!("typical_decode_len={}", r.typical_decode_len));
        }
        Request::Encoder(r) => {
            parts.push(format!("typical_seq_len={}", r.typical_seq_len));
            parts.push(format!("typical_batch={}", r.typical_batch));
        }
    }
    parts.push(format!("threads={} dtype={}", w.target.threads, w.weights.dtype.as_str()));
    parts.join(" ")
}

/// The interfaces that a batched decode step (`Batch::step`) calls once over the rows of all its
/// sequences: the harness times their decode at the workload's batch. The others (rotation,
/// attention, the KV cache, sampling) run once per sequence, as alone.
pub const ROW_BATCHED: &[&str] = &["matmul", "rmsnorm", "swiglu"];

/// The signature of `interface`'s records for a workload of signature `shapes` whose decode steps
/// run `batch` sequences: `shapes`, and `max_batch=N` after it for a row-batched interface of a
/// batched decoder, whose decode step is timed at `N` rows. A per-sequence interface shares the
/// records of the same shapes alone, which measure the same thing.
pub fn interface_shapes(shapes: &str, batch: usize, interface: &str) -> String {
    if batch > 1 && ROW_BATCHED.contains(&interface) {
        format!("{shapes} max_batch={batch}")
    } else {
        shapes.to_string()
    }
}

/// The signature of the records that stand for `interface` of `w` on `class`, and whether they
/// stand in for missing ones: a batched decoder's row-batched interface is measured at its
/// batch (`interface_shapes`), and until `monogen bench` has measured it so on `class`, the
/// records of the same shapes alone (one row per decode step) stand in, which `explain` says.
pub fn records_shapes(rankings: &Rankings, class: &str, interface: &str, w: &Workload) -> (String, bool) {
    let alone = shapes_signature(w);
    let own = interface_shapes(&alone, w.decode_batch(), interface);
    if own == alone || rankings.records(class, interface).iter().any(|r| r.shapes == own) {
        (own, false)
    } else {
        (alone, true)
    }
}

/// The element type a record of `imp` carries: its element type where its folder serves
/// several, else none.
pub fn element_key(imp: &Implementation) -> Option<String> {
    if imp.several_elements { imp.element.clone() } else { None }
}

/// The hash a record keeps of an implementation: its kernel.rs and every shared module it
/// uses, so that editing a shared helper makes the records of its users stale too.
pub fn measured_source_sha256(imp: &Implementation, registry: &Registry) -> String {
    let mut text = format!("kernel {}\n", imp.source_sha256);
    for module in &imp.shared {
        let sha = registry.shared.get(module).map_or("missing", |m| m.source_sha256.as_str());
        text.push_str(&format!("shared {module} {sha}\n"));
    }
    sha256_hex(text.as_bytes())
}

/// What the database says about one candidate of one workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Evidence {
    /// The workload names no hardware class: measurements do not apply.
    NoHardwareClass,
    /// A fresh record that matched the reference.
    Measured(Record),
    /// A fresh record that did not match the reference.
    Failed(Record),
    /// A record exists, but its key no longer matches.
    Stale { record: Record, why: Vec<String> },
    /// No record for these shapes on this hardware class.
    Missing,
}

impl Evidence {
    pub fn fresh_distribution(&self) -> Option<Distribution> {
        match self {
            Evidence::Measured(r) => Some(r.distribution()),
            _ => None,
        }
    }
}

/// The evidence for each of `candidates` (implementations of one interface) for workload `w`.
pub fn evidence(
    rankings: &Rankings,
    registry: &Registry,
    interface: &str,
    candidates: &[&Implementation],
    w: &Workload,
) -> Vec<Evidence> {
    let Some(class) = &w.target.hardware else {
        return candidates.iter().map(|_| Evidence::NoHardwareClass).collect();
    };
    let (shapes, _) = records_shapes(rankings, class, interface, w);
    let records: Vec<&Record> =
        rankings.records(class, interface).iter().filter(|r| r.shapes == shapes).collect();
    // Records are compared only within one machine and toolchain: the newest measurement's.
    let newest = records.iter().max_by(|a, b| a.measured_at.cmp(&b.measured_at)).copied();
    candidates
        .iter()
        .map(|imp| {
            let Some(record) = records.iter().find(|r| r.measures(imp)) else {
                return Evidence::Missing;
            };
            let mut why = Vec::new();
            if record.version != imp.version {
                why.push(format!("it was measured at version {}, the registry has {}", record.version, imp.version));
            }
            if record.source_sha256 != measured_source_sha256(imp, registry) {
                why.push("its source (kernel.rs or a shared module it uses) changed since it was measured".into());
            }
            if split_flags(&record.build_flags).1 != split_flags(BUILD_FLAGS).1 {
                why.push(format!("it was measured with other build flags ({})", record.build_flags));
            }
            why.extend(key_changes(record, imp, &rankings.current));
            if let Some(newest) = newest {
                why.extend(context_changes(record, newest));
            }
            let requests_per_load = w.request.requests_per_load();
            if requests_per_load.is_some()
                && imp.packs_weights
                && record.status == Status::Ok
                && record.load_ns.is_none()
            {
                why.push(
                    "it packs its weights at load, which this workload counts (request.requests_per_load), and the record has no time of its packing"
                        .into(),
                );
            }
            if !why.is_empty() {
                return Evidence::Stale { record: (*record).clone(), why };
            }
            match record.status {
                Status::Ok => Evidence::Measured(match requests_per_load {
                    Some(n) if imp.packs_weights => record.with_load_counted(n),
                    _ => (*record).clone(),
                }),
                Status::Failed => Evidence::Failed((*record).clone()),
            }
        })
        .collect()
}

/// Why `record` (of `imp`) no longer matches what the repository says now ([`Current`]): the
/// harness's templates, the versions of its kernel's dependencies in `Cargo.lock`, the Rust
/// release `rust-toolchain.toml` pins. A key the record predates is not compared.
pub fn key_changes(record: &Record, imp: &Implementation, current: &Current) -> Vec<String> {
    let mut why = Vec::new();
    let arch = record.shapes.split_whitespace().next().unwrap_or_default();
    if let (Some(was), Some(now)) = (&record.harness_sha256, current.harness_sha256.get(arch))
        && was != now
    {
        why.push("the benchmark harness (templates/bench/) changed since it was measured: re-measure".into());
    }
    if let (Some(was), Some(lock)) = (&record.dependencies, &current.lock) {
        let changes = dependency_changes(was, &lock.closure(&imp.dependencies));
        if !changes.is_empty() {
            why.push(format!("{} (Cargo.lock): re-measure", changes.join(", ")));
        }
    }
    if let Some((pin, file)) = &current.rustc_pin
        && rustc_release(&record.rustc) != pin
    {
        why.push(format!("rustc {} → {pin} ({file}): re-measure", rustc_release(&record.rustc)));
    }
    why
}

/// How the machine, toolchain and harness version `record` was measured with differ from
/// those of `newest`, the newest record of its interface at its shapes on its class, which the
/// others are compared with: one reason per difference, naming it.
pub fn context_changes(record: &Record, newest: &Record) -> Vec<String> {
    let mut why = Vec::new();
    let whose = "the newest records of this interface";
    if record.cpu != newest.cpu {
        why.push(format!("CPU {} → {} ({whose}): re-measure", record.cpu, newest.cpu));
    }
    if record.cores != newest.cores {
        why.push(format!("cores {} → {} ({whose}): re-measure", record.cores, newest.cores));
    }
    if record.cpu_features != newest.cpu_features {
        let lost = record.cpu_features.iter().filter(|f| !newest.cpu_features.contains(f));
        let gained = newest.cpu_features.iter().filter(|f| !record.cpu_features.contains(f));
        let list: Vec<String> =
            lost.map(|f| format!("-{f}")).chain(gained.map(|f| format!("+{f}"))).collect();
        let list = if list.is_empty() { "reordered".to_string() } else { list.join(" ") };
        why.push(format!("CPU features {list} ({whose}): re-measure"));
    }
    if record.rustc != newest.rustc {
        why.push(format!("{} → {} ({whose}): re-measure", record.rustc, newest.rustc));
    }
    let (was, now) = (split_flags(&record.build_flags).0, split_flags(&newest.build_flags).0);
    if was != now {
        let shown = |h: &str| if h.is_empty() { "harness=0".to_string() } else { h.to_string() };
        why.push(format!(
            "measured by {} of the benchmark harness, {whose} by {}: re-measure",
            shown(was),
            shown(now)
        ));
    }
    why
}

/// Whether `interface` of `w` needs measurements to be chosen: the workload names a hardware
/// class and more than one implementation competes.
pub fn needs_measurements(w: &Workload, competing: usize) -> bool {
    w.target.hardware.is_some() && competing > 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(median: f64, p90: f64) -> Distribution {
        Distribution { median_ns: median, p90_ns: p90, samples: 31 }
    }

    #[test]
    fn a_difference_inside_the_noise_does_not_flip() {
        // 2% apart with 1% spread: inside the 3% floor.
        assert!(!beats(&dist(98.0, 99.0), &dist(100.0, 101.0)));
        // 8% apart, but the incumbent's tail reaches 10% above its median.
        assert!(!beats(&dist(92.0, 93.0), &dist(100.0, 110.0)));
        // The challenger's own noise counts as well.
        assert!(!beats(&dist(90.0, 105.0), &dist(100.0, 101.0)));
        // Equal medians never flip, whatever the spread.
        assert!(!beats(&dist(100.0, 100.0), &dist(100.0, 100.0)));
    }

    #[test]
    fn a_difference_beyond_the_noise_flips() {
        assert!(beats(&dist(50.0, 55.0), &dist(100.0, 110.0)), "2x with 10% spread");
        assert!(beats(&dist(90.0, 91.0), &dist(100.0, 101.0)), "10% with 1% spread");
        assert!(!beats(&dist(100.0, 110.0), &dist(50.0, 55.0)), "slower never flips");
        // A 2x difference flips unless the spread reaches 100%.
        assert!(!beats(&dist(50.0, 101.0), &dist(100.0, 110.0)));
    }

    #[test]
    fn one_disturbed_sample_cannot_hide_a_difference_beyond_2x() {
        // A CI run: 5 samples, one of the incumbent's preempted (p90 12x its median). The
        // challenger's median is 7x lower; the margin stops at 100%, so it flips.
        assert!(beats(&dist(3_397_457.8, 3_906_892.8), &dist(25_093_280.6, 306_931_570.0)));
        assert!(!beats(&dist(25_093_280.6, 306_931_570.0), &dist(3_397_457.8, 3_906_892.8)));
        // Up to 2x, a wide tail still keeps the incumbent.
        assert!(!beats(&dist(51.0, 55.0), &dist(100.0, 1000.0)));
        assert!(!beats(&dist(50.0, 55.0), &dist(100.0, 1000.0)), "exactly 2x does not flip");
        assert_eq!(noise_margin(&dist(1.0, 50.0), &dist(1.0, 1.0)), MAX_MARGIN);
    }

    #[test]
    fn the_rule_is_antisymmetric_so_choices_cannot_oscillate() {
        let samples =
            [dist(100.0, 104.0), dist(97.0, 99.0), dist(60.0, 70.0), dist(130.0, 200.0), dist(101.0, 101.0)];
        for a in &samples {
            for b in &samples {
                assert!(!(beats(a, b) && beats(b, a)), "{a:?} and {b:?} beat each other");
            }
        }
    }

    fn timed(measured_at: &str, rounds: &[u64]) -> Record {
        let (median, p90) = median_p90(&rounds.iter().map(|&t| t as f64).collect::<Vec<_>>());
        Record {
            element: None,
            implementation: "x".into(),
            version: "1.0.0".into(),
            source_sha256: "ab".into(),
            shapes: "s".into(),
            cpu: "cpu".into(),
            cores: 2,
            cpu_features: vec![],
            rustc: "rustc".into(),
            build_flags: BUILD_FLAGS.into(),
            measured_at: measured_at.into(),
            status: Status::Ok,
            failure: None,
            median_ns: median as u64,
            p90_ns: p90 as u64,
            samples: rounds.len(),
            prefill_median_ns: 0,
            decode_median_ns: 0,
            load_ns: None,
            load_max_ns: None,
            rounds_ns: rounds.to_vec(),
            load_counted_ns: 0,
            load_counted_max_ns: 0,
            harness_sha256: None,
            dependencies: None,
        }
    }

    #[test]
    fn a_batched_decoder_has_records_of_its_own_only_for_the_row_batched_interfaces() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let read = |name: &str| {
            crate::workload::WorkloadSource::read(&root.join(format!("workloads/{name}.toml")))
                .unwrap()
                .parse()
                .unwrap()
        };
        let served: Workload = read("stories260k-serve-cpu-f32");
        assert_eq!(served.decode_batch(), 4);
        let shapes = shapes_signature(&served);
        assert!(!shapes.contains("max_batch"), "{shapes}");
        for interface in ROW_BATCHED {
            assert_eq!(interface_shapes(&shapes, 4, interface), format!("{shapes} max_batch=4"));
        }
        for interface in ["rope", "kv_cache", "attention_prefill", "attention_decode", "sampler"] {
            assert_eq!(interface_shapes(&shapes, 4, interface), shapes, "{interface} runs per sequence");
        }
        let alone: Workload = read("stories260k-cpu-f32");
        assert_eq!(alone.decode_batch(), 1);
        assert_eq!(interface_shapes(&shapes_signature(&alone), 1, "matmul"), shapes_signature(&alone));
        let encoder: Workload = read("all-minilm-l6-v2-cpu-f32");
        assert_eq!(encoder.decode_batch(), 1, "an encoder has no decode step");

        // Without records at the batch, those of the shapes alone stand in, and say so.
        let mut rankings = Rankings::default();
        let record = |shapes: &str| Record { shapes: shapes.into(), ..timed("t", &[1]) };
        rankings.replace("c", "matmul", &shapes, vec![record(&shapes)], |_| true);
        assert_eq!(records_shapes(&rankings, "c", "matmul", &served), (shapes.clone(), true));
        assert_eq!(records_shapes(&rankings, "c", "rope", &served), (shapes.clone(), false));
        let batched = format!("{shapes} max_batch=4");
        rankings.replace("c", "matmul", &batched, vec![record(&batched)], |_| true);
        assert_eq!(records_shapes(&rankings, "c", "matmul", &served), (batched, false));
    }

    #[test]
    fn rounds_of_one_run_compare_pairwise() {
        // The machine slows down and speeds up; the challenger is 5% faster in every round. Its
        // medians are inside each other's spread, so the medians alone keep the incumbent.
        let machine = [100, 140, 120, 180, 120, 100, 160, 100, 180, 140];
        let incumbent = timed("t", &machine);
        let challenger = timed("t", &machine.map(|t| t * 95 / 100));
        assert!(!beats(&challenger.distribution(), &incumbent.distribution()));
        let v = judge(&challenger, &incumbent);
        assert!(v.beats, "{v:?}");
        assert_eq!((v.ratio, v.margin, v.paired_rounds), (0.95, MIN_MARGIN, 10));
        assert!(!judge(&incumbent, &challenger).beats, "never both ways");
        // 2% faster in every round is inside the 3% floor.
        let close = timed("t", &machine.map(|t| t * 98 / 100));
        assert!(!judge(&close, &incumbent).beats);
    }

    #[test]
    fn the_packings_spread_widens_the_margin() {
        // A challenger that packs at load: 90 per request plus a packing of 40 over 4 requests,
        // 10 a request, against 105 in every round: 0.952x round by round.
        let incumbent = timed("t", &[105; 10]);
        let packing = |max| Record { load_ns: Some(40), load_max_ns: max, ..timed("t", &[90; 10]) };
        // A record without the slowest packings takes the packing as exact: the 3% floor.
        let exact = packing(None).with_load_counted(4);
        assert_eq!((exact.median_ns, exact.p90_ns, exact.load_spread()), (100, 100, 0.0));
        let v = judge(&exact, &incumbent);
        assert!(v.beats && v.margin == MIN_MARGIN, "{v:?}");
        // Its slowest packings took 60: the 90th percentile takes 15 a request, and the 5 above
        // the share counted is 5% of the charged median, added to the margin.
        let noisy = packing(Some(60)).with_load_counted(4);
        assert_eq!((noisy.median_ns, noisy.p90_ns, noisy.rounds_ns[0]), (100, 105, 100));
        assert_eq!((noisy.load_counted_ns, noisy.load_counted_max_ns), (10, 15));
        assert!((noisy.load_spread() - 0.05).abs() < 1e-12);
        let v = judge(&noisy, &incumbent);
        assert!(!v.beats && (v.margin - 0.08).abs() < 1e-12, "{v:?}");
        assert!(!judge(&incumbent, &noisy).beats, "never both ways");
        // The same on the incumbent's side: a packing incumbent holds by its own spread too.
        let v = judge(&timed("t", &[95; 10]), &noisy);
        assert!(!v.beats && (v.margin - 0.08).abs() < 1e-12, "{v:?}");
        // Compared by medians (records of two runs), the 90th percentile carries it.
        let other_run = Record { measured_at: "u".into(), ..incumbent.clone() };
        assert_eq!(judge(&noisy, &other_run).paired_rounds, 0);
        assert!((noisy.distribution().relative_spread() - 0.05).abs() < 1e-12);
        // A slowest below the median (not from this harness) counts as the median.
        let odd = packing(Some(20)).with_load_counted(4);
        assert_eq!((odd.p90_ns, odd.load_spread()), (100, 0.0));
    }

    #[test]
    fn rounds_that_disagree_keep_the_incumbent() {
        // Faster by 10% in most rounds, but 30% slower in 2 of 10: the ratios' spread (their
        // 90th percentile is 1.3, 44% above the median 0.9) is the margin.
        let incumbent = timed("t", &[100; 10]);
        let challenger = timed("t", &[90, 90, 90, 90, 90, 90, 90, 90, 130, 130]);
        let v = judge(&challenger, &incumbent);
        assert!(!v.beats && v.paired_rounds == 10, "{v:?}");
        assert!((v.margin - 0.4 / 0.9).abs() < 1e-9, "{v:?}");
    }

    #[test]
    fn records_of_different_runs_compare_by_their_medians() {
        let machine = [100, 140, 120, 180, 120, 100, 160, 100, 180, 140];
        let incumbent = timed("then", &machine);
        let challenger = timed("now", &machine.map(|t| t * 95 / 100));
        let v = judge(&challenger, &incumbent);
        assert!(!v.beats && v.paired_rounds == 0, "{v:?}");
        // Records made before the rounds were kept, or with another number of rounds, too.
        let old = Record { rounds_ns: vec![], ..timed("t", &machine) };
        assert_eq!(judge(&timed("t", &machine.map(|t| t / 2)), &old).paired_rounds, 0);
        assert_eq!(judge(&timed("t", &machine[..9]), &timed("t", &machine)).paired_rounds, 0);
    }

    #[test]
    fn files_round_trip_sorted() {
        let record = |name: &str, shapes: &str| Record {
            element: None,
            implementation: name.into(),
            version: "1.0.0".into(),
            source_sha256: "ab".into(),
            shapes: shapes.into(),
            cpu: "cpu".into(),
            cores: 2,
            cpu_features: vec!["avx2".into()],
            rustc: "rustc 1.95.0".into(),
            build_flags: BUILD_FLAGS.into(),
            measured_at: "2026-11-29T21:00:00Z".into(),
            status: Status::Ok,
            failure: None,
            median_ns: 100,
            p90_ns: 110,
            samples: 31,
            prefill_median_ns: 10,
            decode_median_ns: 1,
            load_ns: None,
            load_max_ns: None,
            rounds_ns: vec![100, 120, 90],
            load_counted_ns: 0,
            load_counted_max_ns: 0,
            harness_sha256: None,
            dependencies: None,
        };
        let mut r = Rankings::default();
        let packing =
            Record { load_ns: Some(31_000_000), load_max_ns: Some(33_000_000), ..record("b", "s1") };
        let all = |_: &Record| true;
        r.replace("c-2c", "matmul", "s1", vec![packing, record("a", "s1")], all);
        let (path, packed_text) = r.render("c-2c", "matmul");
        let path = Path::new(RANKINGS_DIR).join(path);
        assert!(
            packed_text.contains("load_ns = 31000000\nload_max_ns = 33000000\n")
                && !packed_text.contains("load_counted"),
            "{packed_text}"
        );
        assert_eq!(parse_file(&packed_text, &path).unwrap(), r.records("c-2c", "matmul"));
        r.replace("c-2c", "matmul", "s0", vec![record("z", "s0")], all);
        r.replace("c-2c", "matmul", "s1", vec![record("c", "s1")], all);
        let names: Vec<&str> =
            r.records("c-2c", "matmul").iter().map(|r| r.implementation.as_str()).collect();
        assert_eq!(names, ["z", "c"], "a re-measurement replaces the records of its shapes only");
        // A run of one element type leaves the records of the others at the same shapes.
        r.replace("c-2c", "matmul", "s1", vec![record("bf16-d", "s1")], |r| {
            r.implementation.starts_with("bf16-")
        });
        let names: Vec<&str> =
            r.records("c-2c", "matmul").iter().map(|r| r.implementation.as_str()).collect();
        assert_eq!(names, ["z", "bf16-d", "c"], "a re-measurement replaces its element type's records only");
        let (path, text) = r.render("c-2c", "matmul");
        assert_eq!(path, Path::new("c-2c/matmul.toml"), "relative to the database's folder");
        let path = Path::new(RANKINGS_DIR).join(path);
        assert_eq!(parse_file(&text, &path).unwrap(), r.records("c-2c", "matmul"));
        // The share of a load a workload counts is the workload's, never the database's.
        let counted = record("c", "s1").with_load_counted(4);
        assert_eq!(counted, record("c", "s1"), "nothing packed, nothing counted");
        let counted = Record { load_ns: Some(10), ..record("c", "s1") }.with_load_counted(4);
        assert_eq!((counted.median_ns, counted.rounds_ns[1], counted.load_counted_ns), (103, 123, 3));
        for field in ["load_counted_ns", "load_counted_max_ns"] {
            let counted_in_file = packed_text.replacen(
                "load_ns = 31000000\n",
                &format!("load_ns = 31000000\n{field} = 3\n"),
                1,
            );
            let refused = parse_file(&counted_in_file, &path).unwrap_err().to_string();
            assert!(refused.contains(field), "{refused}");
        }
        let broken = parse_file("[[record]]\nimplementation = 3\n", &path).unwrap_err();
        assert!(broken.to_string().contains("rankings/c-2c/matmul.toml cannot be read"), "{broken}");
        // Not TOML at all (an unterminated string): located at its line and column, with the fix.
        let syntax = parse_file("[[record]]\nimplementation = \"a\n", &path).unwrap_err().to_string();
        assert!(syntax.starts_with("rankings/c-2c/matmul.toml:2:"), "{syntax}");
        assert!(
            syntax.contains("cannot be read") && syntax.contains("run `monogen bench` again"),
            "{syntax}"
        );
    }
}
