//! `monogen.lock`: what a generated crate was generated from, as one serde struct.
//!
//! [`emit`](crate::emit) writes it last, with the hash of every other file; `write` reads its
//! file list to find the files an earlier generation wrote and its workload name to refuse to
//! replace another workload's crate; `check` compares its choices with a fresh plan; `resolve`
//! takes its choices as the incumbents of measured rankings. All of them parse it with
//! [`Lock::parse`] (through [`Lock::read`] or [`locked_choices`] where they read it from a
//! crate's folder).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

/// The lock file's name inside a generated crate.
pub const LOCK_FILE: &str = "monogen.lock";

/// The version of the lock file's layout.
pub const FORMAT: u32 = 1;

/// The comment under the `@generated` header.
const PREAMBLE: &str = "# What this crate was generated from. `monogen check` compares it with the repository;\n# `monogen build` uses the file list to find files it wrote before.\n";

/// The contents of `monogen.lock`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lock {
    #[serde(default)]
    pub format: u32,
    /// The monogen version that generated the crate.
    #[serde(default)]
    pub monogen: String,
    /// sha256 of the workload's canonical TOML.
    #[serde(default)]
    pub workload_sha256: String,
    /// Where the workload leaves the speculator to measurement: the choice made
    /// (`none`, or `prompt-lookup, N drafts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<String>,
    /// One per interface, in the order the forward pass uses them.
    #[serde(default)]
    pub choice: Vec<Choice>,
    /// The shared kernel modules the chosen kernels use.
    #[serde(default)]
    pub shared: Vec<Shared>,
    /// Every other file of the crate, with its hash.
    #[serde(default)]
    pub file: Vec<File>,
    /// The workload, as its canonical TOML table.
    #[serde(default)]
    pub workload: toml::Table,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub interface: String,
    /// The part of the model this choice serves where the crate calls the interface twice
    /// (`classifier`: the classifier's own `matmul`); absent for the interface's main choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    pub implementation: String,
    pub version: String,
    pub source_sha256: String,
    /// The registry's revision as the choice saw it: sha256 of every implementation of the
    /// interface that the workload's constraints admit (name, version, kernel and shared
    /// sources). A competitor added, removed or edited changes it, and `check` says so.
    #[serde(default)]
    pub candidates_sha256: String,
}

impl Choice {
    /// Its interface's name, with `_<role>` for a role's choice (`matmul_classifier`):
    /// [`crate::plan::role_module`].
    pub fn key(&self) -> String {
        crate::plan::role_module(&self.interface, self.role.as_deref())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shared {
    pub module: String,
    pub source_sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct File {
    pub path: String,
    pub sha256: String,
}

/// Why a lock file could not be had.
#[derive(Debug)]
pub enum ReadError {
    /// The crate has no lock file.
    Missing,
    Io(std::io::Error),
    /// The file is there but is not a lock file monogen can read.
    Malformed(String),
}

impl Lock {
    /// The lock file's body (without the `@generated` header, which `emit` adds).
    pub fn render(&self) -> String {
        let body = toml::to_string(self).expect("a lock file always serializes");
        format!("{PREAMBLE}{body}")
    }

    /// Parses a lock file's text, header included.
    pub fn parse(text: &str) -> Result<Lock, String> {
        let body = text.split_once('\n').map_or("", |(_, b)| b);
        toml::from_str(body).map_err(|e| e.message().to_string())
    }

    /// Reads `dir`'s lock file.
    pub fn read(dir: &Path) -> Result<Lock, ReadError> {
        let text = match std::fs::read_to_string(dir.join(LOCK_FILE)) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadError::Missing),
            Err(e) => return Err(ReadError::Io(e)),
        };
        Lock::parse(&text).map_err(ReadError::Malformed)
    }

    /// The workload name it records.
    pub fn workload_name(&self) -> Option<&str> {
        self.workload.get("name").and_then(toml::Value::as_str)
    }

    /// Interface → implementation; a role's choice is keyed `<interface>_<role>`, as
    /// [`crate::plan::InterfacePlan::module`] keys it.
    pub fn choices(&self) -> BTreeMap<String, String> {
        self.choice.iter().map(|c| (c.key(), c.implementation.clone())).collect()
    }

    /// The files the generation wrote, the lock file included; refuses a path outside the crate.
    pub fn files(&self, lock_path: &Path) -> Result<Vec<PathBuf>, Error> {
        let mut files: Vec<PathBuf> = self.file.iter().map(|f| PathBuf::from(&f.path)).collect();
        files.push(PathBuf::from(LOCK_FILE));
        if let Some(f) = files
            .iter()
            .find(|f| f.is_absolute() || f.components().any(|c| matches!(c, std::path::Component::ParentDir)))
        {
            return Err(Error::Refused(format!(
                "{} lists a path outside the crate: {}",
                lock_path.display(),
                f.display()
            )));
        }
        Ok(files)
    }
}

/// The choices recorded in `dir`'s monogen.lock (interface → implementation); empty when
/// there is none or it cannot be read.
pub fn locked_choices(dir: &Path) -> BTreeMap<String, String> {
    Lock::read(dir).map(|lock| lock.choices()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_reads_back_what_it_wrote() {
        let mut workload = toml::Table::new();
        workload.insert("name".into(), "w".into());
        let lock = Lock {
            format: FORMAT,
            monogen: "0.1.0".into(),
            workload_sha256: "ab".into(),
            speculation: Some("prompt-lookup, 4 drafts".into()),
            choice: vec![Choice {
                interface: "matmul".into(),
                role: None,
                implementation: "scalar".into(),
                version: "1.0.0".into(),
                source_sha256: "cd".into(),
                candidates_sha256: "12".into(),
            }],
            shared: vec![Shared { module: "team".into(), source_sha256: "ef".into() }],
            file: vec![File { path: "src/lib.rs".into(), sha256: "01".into() }],
            workload,
        };
        let text = format!("# header\n{}", lock.render());
        assert!(text.contains("[[choice]]\ninterface = \"matmul\""), "{text}");
        let back = Lock::parse(&text).unwrap();
        assert_eq!(back, lock);
        assert_eq!(back.workload_name(), Some("w"));
        assert_eq!(back.choices()["matmul"], "scalar");
    }

    #[test]
    fn paths_outside_the_crate_are_refused() {
        let lock = Lock {
            format: FORMAT,
            monogen: String::new(),
            workload_sha256: String::new(),
            speculation: None,
            choice: vec![],
            shared: vec![],
            file: vec![File { path: "../x".into(), sha256: String::new() }],
            workload: toml::Table::new(),
        };
        assert!(lock.files(Path::new("monogen.lock")).is_err());
    }
}
