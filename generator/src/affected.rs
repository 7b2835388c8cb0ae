//! `monogen affected`: from the files changed since a git revision, the workloads to
//! regenerate and the benchmarks to re-run.
//!
//! The folder structure is the taxonomy: a change under `implementations/<interface>/<name>/`
//! affects the workloads that use that implementation or could (it competes for them); a
//! shared module affects the users of the implementations that include it; an interface, the
//! workloads whose architecture calls it; a workload, itself; a ranking file, the workloads of
//! its hardware class that call its interface; templates and the generator, everything.
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
    /// interface → implementation, from its crate's monogen.lock.
    locked: BTreeMap<String, String>,
}

/// What must be regenerated and re-measured after `changed` (paths relative to the root).
pub fn affected(project: &Project, changed: &[String]) -> Result<Affected, Error> {
    let mut known = Vec::new();
    for path in project.workloads()? {
        let rel = path.strip_prefix(&project.root).unwrap_or(&path).to_string_lossy().replace('\\', "/");
        let workload = project.read_workload(&path).ok();
        let name = workload.as_ref().map_or_else(
            || path.file_stem().unwrap_or_default().to_string_lossy().into_owned(),
            |w| w.name.clone(),
        );
        let locked = check::locked_choices(&project.root.join("generated").join(&name));
        known.push(Known { path: rel, name, workload, locked });
    }

    let mut regenerate: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut rebench: BTreeMap<usize, (BTreeSet<String>, Vec<String>)> = BTreeMap::new();
    let mut unaffecting = Vec::new();
    let all_interfaces = |k: &Known| -> Vec<String> {
        k.workload.as_ref().map_or_else(Vec::new, |w| {
            resolve::required_interfaces(w).iter().map(|s| s.to_string()).collect()
        })
    };
    let measured = |k: &Known| k.workload.as_ref().is_some_and(|w| w.target.hardware.is_some());

    for file in changed {
        let parts: Vec<&str> = file.split('/').collect();
        let mut hit = false;
        let mut regen = |i: usize, why: String, hit: &mut bool| {
            *hit = true;
            let reasons = regenerate.entry(i).or_default();
            if !reasons.contains(&why) {
                reasons.push(why);
            }
        };
        let mut bench = |i: usize, interfaces: Vec<String>, why: String| {
            let entry = rebench.entry(i).or_default();
            entry.0.extend(interfaces);
            if !entry.1.contains(&why) {
                entry.1.push(why);
            }
        };
        match parts.as_slice() {
            ["generator", ..] | ["Cargo.toml"] | ["Cargo.lock"] => {
                let harness = file.ends_with("emit/harness.rs") || file.ends_with("src/bench.rs");
                for (i, k) in known.iter().enumerate() {
                    regen(i, format!("{file} changed (the generator affects every crate)"), &mut hit);
                    if harness && measured(k) {
                        bench(i, all_interfaces(k), format!("{file} changed (the benchmark harness)"));
                    }
                }
            }
            ["templates", "bench", ..] => {
                for (i, k) in known.iter().enumerate() {
                    if measured(k) {
                        hit = true;
                        bench(i, all_interfaces(k), format!("{file} changed (the benchmark harness)"));
                    }
                }
            }
            ["templates", ..] => {
                for i in 0..known.len() {
                    regen(i, format!("{file} changed (templates affect every crate)"), &mut hit);
                }
            }
            ["interfaces", name] if name.ends_with(".toml") => {
                let interface = name.trim_end_matches(".toml");
                for (i, k) in known.iter().enumerate() {
                    if all_interfaces(k).iter().any(|x| x == interface) || k.locked.contains_key(interface) {
                        regen(i, format!("interface {interface} changed"), &mut hit);
                        if measured(k) {
                            bench(i, vec![interface.to_string()], format!("interface {interface} changed"));
                        }
                    }
                }
            }
            ["implementations", "_shared", module] => {
                let module = module.trim_end_matches(".rs");
                let users: Vec<(String, String)> = project
                    .registry
                    .implementations
                    .values()
                    .flatten()
                    .filter(|imp| imp.shared.iter().any(|m| m == module))
                    .map(|imp| (imp.interface.clone(), imp.name.clone()))
                    .collect();
                for (interface, name) in users {
                    implementation_changed(
                        &known,
                        project,
                        &interface,
                        &name,
                        &format!("shared module {module}"),
                        &mut regen,
                        &mut bench,
                        &mut hit,
                        &measured,
                    );
                }
            }
            ["implementations", interface, name, ..] => {
                implementation_changed(
                    &known,
                    project,
                    interface,
                    name,
                    &format!("implementations/{interface}/{name}"),
                    &mut regen,
                    &mut bench,
                    &mut hit,
                    &measured,
                );
            }
            ["workloads", _] if file.ends_with(".toml") => {
                for (i, k) in known.iter().enumerate() {
                    if k.path == *file {
                        regen(i, "the workload changed".into(), &mut hit);
                        if measured(k) {
                            bench(i, all_interfaces(k), "the workload changed".into());
                        }
                    }
                }
            }
            [dir, class, name] if *dir == RANKINGS_DIR && name.ends_with(".toml") => {
                let interface = name.trim_end_matches(".toml");
                for (i, k) in known.iter().enumerate() {
                    let same_class =
                        k.workload.as_ref().and_then(|w| w.target.hardware.as_deref()) == Some(class);
                    if same_class && all_interfaces(k).iter().any(|x| x == interface) {
                        regen(i, format!("the rankings of {interface} on {class} changed"), &mut hit);
                    }
                }
            }
            ["generated", name, ..] => {
                for (i, k) in known.iter().enumerate() {
                    if k.name == *name {
                        regen(i, "its generated crate changed".into(), &mut hit);
                    }
                }
            }
            _ => {}
        }
        if !hit {
            unaffecting.push(file.clone());
        }
    }

    Ok(Affected {
        changed: changed.to_vec(),
        regenerate: regenerate
            .into_iter()
            .map(|(i, reasons)| Entry {
                workload: known[i].path.clone(),
                name: known[i].name.clone(),
                reasons,
            })
            .collect(),
        rebench: rebench
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

/// The workloads that use `interface/name` (their lock names it) or could (it competes for
/// them now) must be regenerated; those measured must re-measure the interface.
#[allow(clippy::too_many_arguments)]
fn implementation_changed(
    known: &[Known],
    project: &Project,
    interface: &str,
    name: &str,
    what: &str,
    regen: &mut impl FnMut(usize, String, &mut bool),
    bench: &mut impl FnMut(usize, Vec<String>, String),
    hit: &mut bool,
    measured: &impl Fn(&Known) -> bool,
) {
    for (i, k) in known.iter().enumerate() {
        let uses = k.locked.get(interface).is_some_and(|n| n == name);
        let could = k.workload.as_ref().is_some_and(|w| {
            resolve::required_interfaces(w).contains(&interface)
                && resolve::competitors(project.registry.implementations_of(interface), w)
                    .iter()
                    .any(|imp| imp.name == name)
        });
        if !(uses || could) {
            continue;
        }
        let how = if uses { "it uses it" } else { "it could use it" };
        regen(i, format!("{what} changed ({how})"), hit);
        if measured(k) {
            bench(i, vec![interface.to_string()], format!("{what} changed ({how})"));
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
        }
        let list: Vec<&str> = self.regenerate.iter().map(|e| e.workload.as_str()).collect();
        if !list.is_empty() {
            s.push_str(&format!("  monogen build {}\n", list.join(" ")));
        }
        s
    }
}
