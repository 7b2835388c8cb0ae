//! Why a committed crate differs from what `monogen build` would write now.
//!
//! The previous generation's `monogen.lock` records the monogen version, the workload's
//! hash and every choice with its source hash; comparing it with a fresh plan names the
//! cause of a difference. When none of those changed, the generator or the templates did.

use serde::Deserialize;

use crate::emit::MONOGEN_VERSION;
use crate::plan::Plan;

#[derive(Debug, Deserialize)]
struct Lock {
    #[serde(default)]
    monogen: String,
    #[serde(default)]
    workload_sha256: String,
    #[serde(default)]
    choice: Vec<LockChoice>,
    #[serde(default)]
    shared: Vec<LockShared>,
}

#[derive(Debug, Deserialize)]
struct LockChoice {
    interface: String,
    implementation: String,
    version: String,
    source_sha256: String,
}

#[derive(Debug, Deserialize)]
struct LockShared {
    module: String,
    source_sha256: String,
}

/// The choices recorded in `dir`'s monogen.lock (interface → implementation); empty when
/// there is none or it cannot be read.
pub fn locked_choices(dir: &std::path::Path) -> std::collections::BTreeMap<String, String> {
    let Ok(text) = std::fs::read_to_string(dir.join(crate::emit::LOCK_FILE)) else {
        return Default::default();
    };
    let body = text.split_once('\n').map_or("", |(_, b)| b);
    toml::from_str::<Lock>(body)
        .map(|lock| lock.choice.into_iter().map(|c| (c.interface, c.implementation)).collect())
        .unwrap_or_default()
}

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
    let body = text.split_once('\n').map_or("", |(_, b)| b);
    let Ok(lock) = toml::from_str::<Lock>(body) else {
        return vec!["monogen.lock cannot be read".into()];
    };
    let mut out = Vec::new();
    if lock.monogen != MONOGEN_VERSION {
        out.push(format!("monogen changed: {} → {MONOGEN_VERSION}", lock.monogen));
    }
    if lock.workload_sha256 != plan.workload_sha256 {
        out.push("the workload changed".into());
    }
    for i in &plan.interfaces {
        let c = &i.chosen;
        match lock.choice.iter().find(|l| l.interface == i.interface) {
            None => out.push(format!("{}: new interface, {} {} chosen", i.interface, c.name, c.version)),
            Some(old) if old.implementation != c.name => out.push(format!(
                "{}: the choice changed from {} {} to {} {} ({})",
                i.interface, old.implementation, old.version, c.name, c.version, c.reason
            )),
            Some(old) if old.version != c.version => out
                .push(format!("{}: {} changed version {} → {}", i.interface, c.name, old.version, c.version)),
            Some(old) if old.source_sha256 != c.source_sha256 => {
                out.push(format!("{}: the source of {} changed", i.interface, c.name))
            }
            Some(_) => {}
        }
    }
    for old in &lock.choice {
        if !plan.interfaces.iter().any(|i| i.interface == old.interface) {
            out.push(format!("{}: no longer used", old.interface));
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
