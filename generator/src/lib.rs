//! monogen: a code-generating monomorphizer for ML inference.
//!
//! A workload signature (a TOML file) and the registry of interfaces and implementations go
//! in; a standalone Rust crate in which every choice is resolved comes out. The pipeline has
//! four stages, each usable on its own:
//!
//! 1. [`workload`]: parse and check the workload file (errors point into it);
//! 2. [`resolve`]: pick an implementation per interface, keeping every reason → [`plan::Plan`];
//! 3. [`emit`]: plan + sources + templates → a map from path to file contents, no I/O;
//! 4. [`write`]: write only what changed, atomically, never over a hand edit.
//!
//! [`Project`] ties them to a repository checkout (its `interfaces/`, `implementations/`
//! and `templates/`).

pub mod affected;
pub mod bench;
pub mod check;
pub mod cpu;
pub mod diagnostics;
pub mod emit;
pub mod eval;
pub mod explain;
pub mod host;
pub mod init;
pub mod lock;
pub mod manifest;
pub mod plan;
pub mod rankings;
pub mod registry;
pub mod resolve;
pub mod rust_source;
pub mod speculation;
pub mod synth;
pub mod workload;
pub mod write;

use std::path::{Path, PathBuf};

use diagnostics::Diagnostic;
use emit::{Output, Templates};
use plan::Plan;
use rankings::Rankings;
use registry::Registry;
use workload::{Workload, WorkloadSource};

/// Everything that can stop monogen.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Problems with an input file: a workload, a manifest, a kernel source.
    #[error("{}", .0.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("\n"))]
    Diagnostics(Vec<Diagnostic>),
    /// A template or runtime source of `templates/` is broken.
    #[error("template {name}: {message}")]
    Template { name: String, message: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// monogen will not do what was asked, and says why.
    #[error("{0}")]
    Refused(String),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io { path: path.to_path_buf(), source }
    }

    /// The full, multi-line rendering (rustc-style snippets for diagnostics).
    pub fn render(&self, styled: bool) -> String {
        match self {
            Error::Diagnostics(ds) => ds
                .iter()
                .map(|d| if styled { d.render_styled() } else { d.render() })
                .collect::<Vec<_>>()
                .join("\n"),
            other => format!("error: {other}"),
        }
    }
}

impl From<Vec<Diagnostic>> for Error {
    fn from(ds: Vec<Diagnostic>) -> Error {
        Error::Diagnostics(ds)
    }
}

impl From<Diagnostic> for Error {
    fn from(d: Diagnostic) -> Error {
        Error::Diagnostics(vec![d])
    }
}

/// A monogen repository: the registry and the templates, loaded and checked.
#[derive(Debug, Clone)]
pub struct Project {
    pub root: PathBuf,
    pub registry: Registry,
    pub templates: Templates,
    pub rankings: Rankings,
    /// The ranking database's folder: `rankings/` under `root` unless `--rankings` names
    /// another (a deployment repository's own measurements).
    pub rankings_dir: PathBuf,
}

impl Project {
    /// Loads the registry, templates and rankings under `root`.
    pub fn load(root: &Path) -> Result<Project, Error> {
        Project::load_with(root, None)
    }

    /// Loads the registry and templates under `root`, and the rankings in `rankings` (default
    /// `root/rankings`).
    pub fn load_with(root: &Path, rankings: Option<&Path>) -> Result<Project, Error> {
        let registry = Registry::load(root)?;
        let templates = Templates::load(root)?;
        let rankings_dir = rankings.map_or_else(|| root.join(rankings::RANKINGS_DIR), Path::to_path_buf);
        let mut rankings = Rankings::load(&rankings_dir)?;
        rankings.current = rankings::Current::read(root, &rankings_dir)?;
        Ok(Project { root: root.to_path_buf(), registry, templates, rankings, rankings_dir })
    }

    /// The nearest folder at or above `start` that holds `interfaces/`, `implementations/`
    /// and `templates/`.
    pub fn discover(start: &Path) -> Option<PathBuf> {
        let start = std::fs::canonicalize(start).ok()?;
        start.ancestors().find(|dir| is_root(dir)).map(Path::to_path_buf)
    }

    /// Reads and checks a workload file.
    pub fn read_workload(&self, path: &Path) -> Result<Workload, Error> {
        Ok(WorkloadSource::read(path)?.parse()?)
    }

    /// Resolves a workload against the registry and the rankings, with the crate in its
    /// default output directory as the previous generation.
    pub fn plan(&self, workload: &Workload, path: &Path) -> Result<Plan, Error> {
        self.plan_for(workload, path, &self.default_out_dir(&workload.name))
    }

    /// Resolves a workload whose crate lives in `out_dir`: the choices recorded in its
    /// monogen.lock are the incumbents of measured rankings.
    /// A choice that changes the crate's is not adopted where an evaluation of exactly the
    /// crate it makes missed the workload's `[quality]` bar (`eval::keep_what_clears_the_bar`).
    pub fn plan_for(&self, workload: &Workload, path: &Path, out_dir: &Path) -> Result<Plan, Error> {
        let plan = self.plan_forced(workload, path, out_dir, Default::default())?;
        eval::keep_what_clears_the_bar(self, workload, path, out_dir, plan)
    }

    /// [`Project::plan_for`] with the choices `forced` (interface → implementation) made
    /// whatever the rankings say: a crate built both ways to confirm a flip.
    pub fn plan_forced(
        &self,
        workload: &Workload,
        path: &Path,
        out_dir: &Path,
        forced: std::collections::BTreeMap<String, String>,
    ) -> Result<Plan, Error> {
        self.plan_forced_because(workload, path, out_dir, forced, None)
    }

    /// [`Project::plan_forced`], the plan saying `because` of each forced choice.
    pub fn plan_forced_because(
        &self,
        workload: &Workload,
        path: &Path,
        out_dir: &Path,
        forced: std::collections::BTreeMap<String, String>,
        because: Option<String>,
    ) -> Result<Plan, Error> {
        let selection = resolve::Selection {
            rankings: self.rankings.clone(),
            incumbents: check::locked_choices(out_dir),
            forced,
            forced_because: because,
        };
        Ok(resolve::resolve(workload, &self.registry, &selection, path)?)
    }

    /// Emits the crate for a plan.
    pub fn emit(&self, plan: &Plan) -> Result<Output, Error> {
        emit::emit(plan, &self.registry, &self.templates)
    }

    /// Parse, resolve and emit: the crate `monogen build` would write for `path`.
    pub fn generate(&self, path: &Path) -> Result<(Plan, Output), Error> {
        self.generate_into(path, None)
    }

    /// [`Project::generate`] for a crate in `out_dir` (default: generated/<name>/).
    pub fn generate_into(&self, path: &Path, out_dir: Option<&Path>) -> Result<(Plan, Output), Error> {
        let workload = self.read_workload(path)?;
        let dir = out_dir.map_or_else(|| self.default_out_dir(&workload.name), Path::to_path_buf);
        let plan = self.plan_for(&workload, path, &dir)?;
        let output = self.emit(&plan)?;
        Ok((plan, output))
    }

    /// Where the crate of the workload named `name` goes unless `--out` says otherwise.
    pub fn default_out_dir(&self, name: &str) -> PathBuf {
        self.root.join("generated").join(name)
    }

    /// Whether the file at `path` lies in the repository: its crate may go to generated/.
    /// A workload of a deployment repository names its own crate folder (`--out`).
    pub fn owns(&self, path: &Path) -> bool {
        let root = std::fs::canonicalize(&self.root).unwrap_or_else(|_| self.root.clone());
        std::fs::canonicalize(path).is_ok_and(|p| p.starts_with(root))
    }

    /// Every workload under `workloads/`, sorted.
    pub fn workloads(&self) -> Result<Vec<PathBuf>, Error> {
        let dir = self.root.join("workloads");
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        let mut paths: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        paths.sort();
        Ok(paths)
    }
}

fn is_root(dir: &Path) -> bool {
    ["interfaces", "implementations", "templates"].iter().all(|d| dir.join(d).is_dir())
}

/// `path` relative to the current directory when it is below it (shorter messages).
pub fn shown(path: &Path) -> String {
    let cwd = std::env::current_dir().ok().and_then(|d| std::fs::canonicalize(d).ok());
    let full = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    match cwd.as_deref().and_then(|cwd| full.strip_prefix(cwd).ok()) {
        Some(relative) if !relative.as_os_str().is_empty() => relative.display().to_string(),
        _ => path.display().to_string(),
    }
}
