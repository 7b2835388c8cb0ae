//! `monogen affected`: from the files changed since a git revision, the workloads to
//! regenerate and the benchmarks to re-run.
//!
//! The folder structure is the taxonomy: a change under `implementations/<interface>/<name>/`
//! affects the workloads that use that implementation or could (it competes for them); a
//! shared module affects the users of the implementations that include it; an interface, the
//! workloads whose architecture calls it; a workload, itself; a ranking file, the workloads of
//! its hardware class that call its interface; the benchmark harness's templates, the
//! measurements of every workload that names a class; other templates and the generator,
//! every crate.
//! [`affected`] is a pure function of the list of paths and the repository's contents.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde::Serialize;

use crate::rankings::RANKINGS_DIR;
use crate::workload::Workload;
use crate::{Error, Project, check, resolve};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Affected {
    /// The changed paths, relative to the project root.
    pub changed: Vec<String>,
    /// Workloads whose crates must be regenerated, with why.
    pub regenerate: Vec<Entry>,
    /// Workloads whose benchmarks must be re-run, with the interfaces and why.
    pub rebench: Vec<BenchEntry>,
    /// Changed paths that affect no workload (docs, tests, ...).
    pub unaffecting: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Entry {
    pub workload: String,
    pub name: String,
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BenchEntry {
    pub workload: String,
    pub name: String,
    pub interfaces: Vec<String>,
    pub reasons: Vec<String>,
}

/// The files changed between `base` and the working tree (committed, staged, unstaged and
/// untracked), relative to `root`.
pub fn changed_files(root: &Path, base: &str) -> Result<Vec<String>, Error> {
    let git = |args: &[&str]| -> Result<String, Error> {
        let out = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .map_err(|e| Error::Refused(format!("cannot run git: {e}")))?;
        if !out.status.success() {
            return Err(Error::Refused(format!(
                "`git {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    git(&["rev-parse", "--verify", "--quiet", &format!("{base}^{{commit}}")])
        .map_err(|_| Error::Refused(format!("`{base}` is not a git revision of {}", root.display())))?;
    let mut files: BTreeSet<String> = BTreeSet::new();
    for line in git(&["diff", "--name-only", "--relative", "--no-renames", base, "--"])?.lines() {
        files.insert(line.to_string());
    }
    for line in git(&["ls-files", "--others", "--exclude-standard"])?.lines() {
        files.insert(line.to_string());
    }
    Ok(files.into_iter().filter(|f| !f.is_empty()).collect())
}

/// One workload of `workloads/`, as far as it could be read.
struct Known {
    path: String,
    name: String,
    workload: Option<Workload>,
    /// interface → implementation, from its crate's monogen.lock (a role's instance keyed
    /// `<interface>_<role>`, a draft model's choices `draft/<interface>`).
    locked: BTreeMap<String, String>,
}

/// Whether the lock key `key` is a choice for `interface`: the interface's own, a role's
/// instance of it, or either of a draft model's.
fn serves(key: &str, interface: &str) -> bool {
    let key = key.strip_prefix(&format!("{}/", crate::emit::DRAFT_DIR)).unwrap_or(key);
    key == interface || key == crate::plan::role_module(interface, Some(crate::plan::CLASSIFIER))
}

/// What must be regenerated and re-measured after `changed` (paths relative to the root).
pub fn affected(project: &Project, changed: &[String]) -> Result<Affected, Error> {
    let known = known_workloads(project)?;
    let mut impact =
        Impact { project, known: &known, regenerate: BTreeMap::new(), rebench: BTreeMap::new(), hit: false };
    let mut unaffecting = Vec::new();
    for file in changed {
        if !impact.file_changed(file) {
            unaffecting.push(file.clone());
        }
    }

    Ok(Affected {
        changed: changed.to_vec(),
        regenerate: impact
            .regenerate
            .into_iter()
            .map(|(i, reasons)| Entry {
                workload: known[i].path.clone(),
                name: known[i].name.clone(),
                reasons,
            })
            .collect(),
        rebench: impact
            .rebench
            .into_iter()
            .map(|(i, (interfaces, reasons))| BenchEntry {
                workload: known[i].path.clone(),
                name: known[i].name.clone(),
                interfaces: interfaces.into_iter().collect(),
                reasons,
            })
            .collect(),
        unaffecting,
    })
}

/// Every workload of `workloads/`, as far as it could be read, with the choices its crate's
/// lock records.
fn known_workloads(project: &Project) -> Result<Vec<Known>, Error> {
    let mut known = Vec::new();
    for path in project.workloads()? {
        let rel = path.strip_prefix(&project.root).unwrap_or(&path).to_string_lossy().replace('\\', "/");
        let workload = project.read_workload(&path).ok();
        let name = workload.as_ref().map_or_else(
            || path.file_stem().unwrap_or_default().to_string_lossy().into_owned(),
            |w| w.name.clone(),
        );
        let krate = project.root.join("generated").join(&name);
        let mut locked = check::locked_choices(&krate);
        // A draft model's crate inside it (draft/) has choices of its own.
        let draft = check::locked_choices(&krate.join(crate::emit::DRAFT_DIR));
        locked.extend(draft.into_iter().map(|(key, imp)| (format!("{}/{key}", crate::emit::DRAFT_DIR), imp)));
        known.push(Known { path: rel, name, workload, locked });
    }
    Ok(known)
}

/// Every interface a known workload's forward pass calls (none if it could not be read).
fn all_interfaces(k: &Known) -> Vec<String> {
    k.workload
        .as_ref()
        .map_or_else(Vec::new, |w| resolve::required_interfaces(w).iter().map(|s| s.to_string()).collect())
}

/// Whether a known workload names a hardware class, so that its kernels are measured.
fn measured(k: &Known) -> bool {
    k.workload.as_ref().is_some_and(|w| w.target.hardware.is_some())
}

/// The workloads that the changed files affect, by index in `known`, with why.
struct Impact<'a> {
    project: &'a Project,
    known: &'a [Known],
    /// Workloads to regenerate, with the reasons.
    regenerate: BTreeMap<usize, Vec<String>>,
    /// Workloads to re-measure, with the interfaces and the reasons.
    rebench: BTreeMap<usize, (BTreeSet<String>, Vec<String>)>,
    /// Whether the file being looked at affects a workload.
    hit: bool,
}

impl Impact<'_> {
    /// Adds what `file` affects; false when it affects no workload.
    fn file_changed(&mut self, file: &str) -> bool {
        self.hit = false;
        let parts: Vec<&str> = file.split('/').collect();
        match parts.as_slice() {
            ["generator", ..] | ["Cargo.toml"] | ["Cargo.lock"] => self.generator_changed(file),
            ["templates", "bench", ..] => self.bench_templates_changed(file),
            ["templates", ..] => {
                for i in 0..self.known.len() {
                    self.regen(i, format!("{file} changed (templates affect every crate)"));
                }
            }
            ["interfaces", name] if name.ends_with(".toml") => {
                self.interface_changed(name.trim_end_matches(".toml"))
            }
            ["implementations", "_shared", module] => {
                self.shared_module_changed(module.trim_end_matches(".rs"))
            }
            ["implementations", interface, name, ..] => {
                self.implementation_changed(interface, name, &format!("implementations/{interface}/{name}"))
            }
            ["workloads", _] if file.ends_with(".toml") => self.workload_changed(file),
            [dir, class, name] if *dir == RANKINGS_DIR && name.ends_with(".toml") => {
                self.rankings_changed(class, name.trim_end_matches(".toml"))
            }
            ["generated", name, ..] => {
                let known = self.known;
                for (i, k) in known.iter().enumerate() {
                    if k.name == *name {
                        self.regen(i, "its generated crate changed".into());
                    }
                }
            }
            _ => {}
        }
        self.hit
    }

    /// Workload `i` must be regenerated, for `why`.
    fn regen(&mut self, i: usize, why: String) {
        self.hit = true;
        let reasons = self.regenerate.entry(i).or_default();
        if !reasons.contains(&why) {
            reasons.push(why);
        }
    }

    /// Workload `i` must re-measure `interfaces`, for `why`.
    fn bench(&mut self, i: usize, interfaces: Vec<String>, why: String) {
        let entry = self.rebench.entry(i).or_default();
        entry.0.extend(interfaces);
        if !entry.1.contains(&why) {
            entry.1.push(why);
        }
    }

    /// A file of the generator (or the workspace's Cargo files) affects every crate; the
    /// benchmark harness, every measurement.
    fn generator_changed(&mut self, file: &str) {
        let harness = file.ends_with("emit/harness.rs") || file.ends_with("src/bench.rs");
        let known = self.known;
        for (i, k) in known.iter().enumerate() {
            self.regen(i, format!("{file} changed (the generator affects every crate)"));
            if harness && measured(k) {
                self.bench(i, all_interfaces(k), format!("{file} changed (the benchmark harness)"));
            }
        }
    }

    /// A template of the benchmark harness affects the measurements of every measured workload.
    fn bench_templates_changed(&mut self, file: &str) {
        let known = self.known;
        for (i, k) in known.iter().enumerate() {
            if measured(k) {
                self.hit = true;
                self.bench(i, all_interfaces(k), format!("{file} changed (the benchmark harness)"));
            }
        }
    }

    /// An interface affects the workloads that call it or whose lock names it.
    fn interface_changed(&mut self, interface: &str) {
        let known = self.known;
        for (i, k) in known.iter().enumerate() {
            if all_interfaces(k).iter().any(|x| x == interface)
                || k.locked.keys().any(|key| serves(key, interface))
            {
                self.regen(i, format!("interface {interface} changed"));
                if measured(k) {
                    self.bench(i, vec![interface.to_string()], format!("interface {interface} changed"));
                }
            }
        }
    }

    /// A shared module affects what every implementation that includes it affects.
    fn shared_module_changed(&mut self, module: &str) {
        // One entry per implementation: a folder of several element types is one user.
        let users: std::collections::BTreeSet<(String, String)> = self
            .project
            .registry
            .implementations
            .values()
            .flatten()
            .filter(|imp| imp.shared.iter().any(|m| m == module))
            .map(|imp| (imp.interface.clone(), imp.name.clone()))
            .collect();
        for (interface, name) in users {
            self.implementation_changed(&interface, &name, &format!("shared module {module}"));
        }
    }

    /// The workloads that use `interface/name` (their lock names it) or could (it competes for
    /// them now) must be regenerated; those measured must re-measure the interface.
    fn implementation_changed(&mut self, interface: &str, name: &str, what: &str) {
        let known = self.known;
        for (i, k) in known.iter().enumerate() {
            // Its lock names it for the interface, a role's own instance of it
            // (`matmul_classifier`), or its draft model's.
            let uses = k.locked.iter().any(|(key, n)| n == name && serves(key, interface));
            let could = k.workload.as_ref().is_some_and(|w| {
                resolve::required_interfaces(w).contains(&interface)
                    && resolve::competitors(self.project.registry.implementations_of(interface), w)
                        .iter()
                        .any(|imp| imp.name == name)
            });
            if !(uses || could) {
                continue;
            }
            let how = if uses { "it uses it" } else { "it could use it" };
            self.regen(i, format!("{what} changed ({how})"));
            if measured(k) {
                self.bench(i, vec![interface.to_string()], format!("{what} changed ({how})"));
            }
        }
    }

    /// A workload file affects itself.
    fn workload_changed(&mut self, file: &str) {
        let known = self.known;
        for (i, k) in known.iter().enumerate() {
            if k.path == *file {
                self.regen(i, "the workload changed".into());
                if measured(k) {
                    self.bench(i, all_interfaces(k), "the workload changed".into());
                }
            }
        }
    }

    /// The rankings of `interface` on hardware class `class` affect the workloads of that
    /// class that call the interface.
    fn rankings_changed(&mut self, class: &str, interface: &str) {
        let known = self.known;
        // confirmations.toml: the end-to-end checks of flips, of any interface.
        let every = format!("{interface}.toml") == crate::rankings::CONFIRMATIONS_FILE;
        // speculation.toml: the measurements of speculation left to measurement.
        let speculation = format!("{interface}.toml") == crate::speculation::SPECULATION_FILE;
        for (i, k) in known.iter().enumerate() {
            let same_class = k.workload.as_ref().and_then(|w| w.target.hardware.as_deref()) == Some(class);
            if speculation {
                if same_class
                    && k.workload.as_ref().is_some_and(|w| crate::speculation::measured(w).is_some())
                {
                    self.regen(i, format!("the measurements of speculation on {class} changed"));
                }
            } else if same_class && every {
                self.regen(i, format!("the end-to-end checks of flips on {class} changed"));
            } else if same_class && all_interfaces(k).iter().any(|x| x == interface) {
                self.regen(i, format!("the rankings of {interface} on {class} changed"));
            }
        }
    }
}

impl Affected {
    /// The text form.
    pub fn render(&self, base: &str) -> String {
        let mut s = format!("{} file(s) changed since {base}\n", self.changed.len());
        if self.regenerate.is_empty() && self.rebench.is_empty() {
            s.push_str("nothing to regenerate or re-measure\n");
            return s;
        }
        if !self.rebench.is_empty() {
            s.push_str("\nre-run benchmarks (monogen bench):\n");
            for e in &self.rebench {
                s.push_str(&format!(
                    "  {} [{}]: {}\n",
                    e.workload,
                    e.interfaces.join(", "),
                    e.reasons.join("; ")
                ));
            }
        }
        if !self.regenerate.is_empty() {
            s.push_str("\nregenerate (monogen build):\n");
            for e in &self.regenerate {
                s.push_str(&format!("  {}: {}\n", e.workload, e.reasons.join("; ")));
            }
        }
        s.push_str("\nthen:\n");
        if !self.rebench.is_empty() {
            let list: Vec<&str> = self.rebench.iter().map(|e| e.workload.as_str()).collect();
            s.push_str(&format!(
                "  monogen bench {}   # on each workload's hardware class\n",
                list.join(" ")
            ));
            // Speculation left to measurement is measured on the model's real weights.
            for e in self.rebench.iter().filter(|e| e.interfaces.iter().any(|i| i == "speculator")) {
                s.push_str(&format!(
                    "  monogen bench {} --interface speculator --model MODEL_DIR   # on its real weights\n",
                    e.workload
                ));
            }
        }
        let list: Vec<&str> = self.regenerate.iter().map(|e| e.workload.as_str()).collect();
        if !list.is_empty() {
            s.push_str(&format!("  monogen build {}\n", list.join(" ")));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::serves;

    #[test]
    fn a_lock_key_serves_its_interface_its_roles_and_a_draft_models() {
        for key in ["matmul", "matmul_classifier", "draft/matmul", "draft/matmul_classifier"] {
            assert!(serves(key, "matmul"), "{key}");
        }
        for (key, interface) in
            [("attention_decode", "attention"), ("rmsnorm", "matmul"), ("draft/rope", "matmul")]
        {
            assert!(!serves(key, interface), "{key} {interface}");
        }
    }
}
