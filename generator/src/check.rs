//! Why a committed crate differs from what `monogen build` would write now.
//!
//! The previous generation's `monogen.lock` records the monogen version, the workload's
//! hash and every choice with its source hash; comparing it with a fresh plan names the
//! cause of a difference. When none of those changed, the generator or the templates did.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::emit::MONOGEN_VERSION;
use crate::emit::WORKLOAD_FILE;
use crate::lock::LOCK_FILE;
use crate::lock::Lock;
pub use crate::lock::locked_choices;
use crate::plan::Plan;
use crate::{Error, Project, shown};

/// The causes of a difference, given the old lock file's text (header included).
pub fn reasons(
    old_lock: Option<&str>,
    plan: &Plan,
    registry: &crate::registry::Registry,
    diff: &crate::write::Diff,
) -> Vec<String> {
    let Some(text) = old_lock else {
        return vec!["the crate has not been generated yet (no monogen.lock)".into()];
    };
    let Ok(lock) = Lock::parse(text) else {
        return vec!["monogen.lock cannot be read".into()];
    };
    let mut out = Vec::new();
    if lock.monogen != MONOGEN_VERSION {
        out.push(format!("monogen changed: {} → {MONOGEN_VERSION}", lock.monogen));
    }
    if lock.workload_sha256 != plan.workload_sha256 {
        out.push("the workload changed".into());
    }
    if let crate::plan::Consts::Llama(crate::plan::LlamaConsts { speculation_measured: Some(m), .. }) =
        &plan.consts
        && lock.speculation.as_deref() != Some(m.chosen.as_str())
    {
        out.push(format!(
            "speculation: the measured choice changed from {} to {} ({})",
            lock.speculation.as_deref().unwrap_or("none"),
            m.chosen,
            m.reason
        ));
    }
    for i in &plan.interfaces {
        let c = &i.chosen;
        let title = i.title();
        match lock.choice.iter().find(|l| l.key() == i.module()) {
            None => out.push(format!("{title}: new interface, {} {} chosen", c.name, c.version)),
            Some(old) if old.implementation != c.name => out.push(format!(
                "{title}: the choice changed from {} {} to {} {} ({})",
                old.implementation, old.version, c.name, c.version, c.reason
            )),
            Some(old) if old.version != c.version => {
                out.push(format!("{title}: {} changed version {} → {}", c.name, old.version, c.version))
            }
            Some(old) if old.source_sha256 != c.source_sha256 => {
                out.push(format!("{title}: the source of {} changed", c.name))
            }
            Some(old) if old.candidates_sha256.is_empty() => out.push(format!(
                "{title}: the lock records no registry revision for it (written before monogen recorded one)"
            )),
            Some(old) if old.candidates_sha256 != c.candidates_sha256 => out.push(format!(
                "{title}: its candidates in the registry changed (an implementation of it was added, removed or edited; `monogen explain` lists them)"
            )),
            Some(_) => {}
        }
    }
    for old in &lock.choice {
        if !plan.interfaces.iter().any(|i| i.module() == old.key()) {
            let title = crate::plan::role_title(&old.interface, old.role.as_deref());
            out.push(format!("{title}: no longer used"));
        }
    }
    for module in &plan.shared_modules {
        let now = &registry.shared[module].source_sha256;
        match lock.shared.iter().find(|s| &s.module == module) {
            Some(old) if &old.source_sha256 == now => {}
            Some(_) => out.push(format!("shared module {module} changed")),
            None => out.push(format!("shared module {module} is newly used")),
        }
    }
    if !diff.hand_edited.is_empty() {
        out.push(format!("{} file(s) were edited by hand", diff.hand_edited.len()));
    }
    let lock_path = std::path::Path::new(crate::emit::LOCK_FILE);
    let deleted = diff.missing.iter().filter(|p| *p != lock_path).count();
    if deleted > 0 {
        out.push(format!("{deleted} generated file(s) are missing"));
    }
    if out.is_empty() {
        out.push(
            "the generator or the templates changed (the workload and every chosen source are the same)"
                .into(),
        );
    }
    out
}

/// What `monogen check` found for one crate.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Finding {
    /// The crate is what `build` would write now, and every competing kernel is measured.
    Ok { dir: PathBuf, workload: PathBuf },
    /// The crate differs from what `build` would write, or kernels lack measurements.
    Stale {
        dir: PathBuf,
        workload: PathBuf,
        /// Why, one cause a line.
        because: Vec<String>,
        /// `(what, file, edited by hand)`: `missing`, `differs` or `stale`.
        files: Vec<(String, PathBuf, bool)>,
        /// The command that fixes it.
        fix: String,
    },
    /// A crate under generated/ that no workload under workloads/ generates.
    Orphan { dir: PathBuf, name: String },
}

/// What `monogen check` found, crate by crate.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    /// Whether every crate is fresh.
    pub fn is_clean(&self) -> bool {
        self.findings.iter().all(|f| matches!(f, Finding::Ok { .. }))
    }

    /// The text `monogen check` prints.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for f in &self.findings {
            match f {
                Finding::Ok { dir, workload } => {
                    s.push_str(&format!("ok      {} ({})\n", shown(dir), shown(workload)));
                }
                Finding::Stale { dir, workload, because, files, fix } => {
                    s.push_str(&format!("STALE   {} ({})\n", shown(dir), shown(workload)));
                    for reason in because {
                        s.push_str(&format!("        because {reason}\n"));
                    }
                    for (what, file, edited) in files {
                        let edited = if *edited { " (edited by hand)" } else { "" };
                        s.push_str(&format!("        {what}: {}{edited}\n", file.display()));
                    }
                    s.push_str(&format!("        fix: {fix}\n"));
                }
                Finding::Orphan { dir, name } => {
                    s.push_str(&format!("ORPHAN  {} has no workload in workloads/\n", shown(dir)));
                    s.push_str(&format!("        fix: delete it, or add workloads/{name}.toml\n"));
                }
            }
        }
        s
    }
}

/// What to check: the named workloads, every workload under workloads/ (`all`), and where
/// their crates are (`out`, for one workload; generated/<name>/ otherwise); and crates anywhere
/// (`crates`), each from its own copy of its workload.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub workloads: Vec<PathBuf>,
    pub all: bool,
    pub out: Option<PathBuf>,
    pub crates: Vec<PathBuf>,
}

/// The workload file of the crate in `dir`: its copy `dir/workload.toml`, which `build` writes
/// into every crate. Refused, saying why, when `dir` is not a crate or predates the copy.
pub fn crate_workload(dir: &Path) -> Result<PathBuf, Error> {
    let workload = dir.join(WORKLOAD_FILE);
    if workload.is_file() {
        return Ok(workload);
    }
    Err(Error::Refused(if dir.join(LOCK_FILE).is_file() {
        format!(
            "{} has no {WORKLOAD_FILE}: it was generated before crates kept a copy of their workload. Run `monogen build WORKLOAD --out {}` once with the workload it was made from",
            shown(dir),
            shown(dir)
        )
    } else if dir.is_dir() {
        format!(
            "{} is not a crate monogen generated (it has no {LOCK_FILE} and no {WORKLOAD_FILE}); `monogen build WORKLOAD --out {}` generates one there",
            shown(dir),
            shown(dir)
        )
    } else {
        format!("{} does not exist; --crate takes the folder of a crate monogen generated", shown(dir))
    }))
}

/// Compares each workload's crate with what `build` would write now.
pub fn check(project: &Project, request: &Request) -> Result<Report, Error> {
    let mut paths = request.workloads.clone();
    if request.all {
        paths.extend(project.workloads()?);
    }
    if paths.is_empty() && request.crates.is_empty() {
        return Err(Error::Refused(
            "name the workloads to check, pass --all, or name crates with --crate".into(),
        ));
    }
    let mut seen = BTreeSet::new();
    paths.retain(|p| seen.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())));
    if request.out.is_some() && paths.len() > 1 {
        return Err(Error::Refused("--out takes one workload; check the others separately".into()));
    }
    // (workload file, crate folder, whether the crate was named with --crate)
    let mut targets: Vec<(PathBuf, Option<PathBuf>, bool)> =
        paths.into_iter().map(|p| (p, request.out.clone(), false)).collect();
    let mut seen_crates = BTreeSet::new();
    for dir in &request.crates {
        if seen_crates.insert(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone())) {
            targets.push((crate_workload(dir)?, Some(dir.clone()), true));
        }
    }
    let mut report = Report::default();
    let mut names: Vec<String> = Vec::new();
    for (path, out, from_crate) in &targets {
        let (plan, output) = project.generate_into(path, out.as_deref())?;
        let dir = out.clone().unwrap_or_else(|| project.default_out_dir(&plan.name));
        if !from_crate {
            if names.contains(&plan.name) {
                return Err(Error::Refused(format!(
                    "two workloads are named `{}` (the second is {}); each crate needs its own name",
                    plan.name,
                    shown(path)
                )));
            }
            names.push(plan.name.clone());
        }
        report.findings.push(finding(project, path, &dir, *from_crate, &plan, &output)?);
    }
    if request.all {
        let generated = project.root.join("generated");
        if let Ok(entries) = std::fs::read_dir(&generated) {
            let mut orphans: Vec<String> = entries
                .flatten()
                .filter(|e| e.path().join(LOCK_FILE).exists())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !names.contains(n))
                .collect();
            orphans.sort();
            for name in orphans {
                report.findings.push(Finding::Orphan { dir: generated.join(&name), name });
            }
        }
    }
    Ok(report)
}

fn finding(
    project: &Project,
    path: &Path,
    dir: &Path,
    from_crate: bool,
    plan: &Plan,
    output: &crate::emit::Output,
) -> Result<Finding, Error> {
    let diff = crate::write::diff(dir, output)?;
    let unmeasured: Vec<&String> = plan.interfaces.iter().flat_map(|i| &i.unmeasured).collect();
    let workload = project.read_workload(path)?;
    let quality = crate::eval::gate(project, &workload, path, output)?;
    let speculation = match &plan.consts {
        crate::plan::Consts::Llama(c) => c.speculation_measured.as_ref().and_then(|m| m.unmeasured.clone()),
        crate::plan::Consts::Bert(_) => None,
    };
    if diff.is_clean() && unmeasured.is_empty() && quality.is_empty() && speculation.is_none() {
        return Ok(Finding::Ok { dir: dir.to_path_buf(), workload: path.to_path_buf() });
    }
    let mut because = Vec::new();
    if !diff.is_clean() {
        let old_lock = std::fs::read_to_string(dir.join(LOCK_FILE)).ok();
        because.extend(reasons(old_lock.as_deref(), plan, &project.registry, &diff));
    }
    because.extend(unmeasured.iter().map(|n| n.to_string()));
    if let Some(why) = &speculation {
        because.push(format!("speculation is left to measurement, and it is {why}"));
    }
    because.extend(quality.iter().cloned());
    let mut files = Vec::new();
    for (what, list) in [("missing", &diff.missing), ("differs", &diff.modified), ("stale", &diff.stale)] {
        for f in list {
            files.push((what.to_string(), f.clone(), diff.hand_edited.contains(f)));
        }
    }
    let build = if from_crate {
        format!("monogen build --crate {}", shown(dir))
    } else if *dir == project.default_out_dir(&plan.name) {
        format!("monogen build {}", shown(path))
    } else {
        format!("monogen build {} --out {}", shown(path), shown(dir))
    };
    let what = if from_crate { format!("--crate {}", shown(dir)) } else { shown(path) };
    let mut steps = Vec::new();
    if !unmeasured.is_empty() {
        steps.push(format!(
            "monogen bench --stale {what} (on hardware class {})",
            plan.target.hardware.as_deref().unwrap_or_default()
        ));
    }
    if speculation.is_some() {
        steps.push(format!(
            "monogen bench {what} --interface speculator --model MODEL_DIR (on hardware class {})",
            plan.target.hardware.as_deref().unwrap_or_default()
        ));
    }
    if !unmeasured.is_empty() || speculation.is_some() || !diff.is_clean() {
        steps.push(build);
    }
    if !quality.is_empty() {
        steps.push(if workload.quality.is_none() {
            format!("add a [quality] bar to {} (docs/quality.md), then monogen eval {what} --model MODEL_DIR", shown(path))
        } else {
            format!("monogen eval {what} --model MODEL_DIR (and, if it fails its bar, a kernel or dtype that clears it)")
        });
    }
    let fix = steps.join(", then ");
    Ok(Finding::Stale { dir: dir.to_path_buf(), workload: path.to_path_buf(), because, files, fix })
}
