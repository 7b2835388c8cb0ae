//! Helpers shared by the command-line tests: scratch copies of the repository and a way to
//! run `monogen` in them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn models_root() -> PathBuf {
    std::env::var_os("MONOGEN_MODELS")
        .map_or_else(|| workspace_root().join("../shared/models"), PathBuf::from)
}

/// The folder of real model `model`, or `None` after saying that `test` skipped without it
/// (counted as tests/src/skip.rs counts skips); under CI (`CI=true`) a missing model fails.
pub fn model_or_skip(model: &str, test: &str) -> Option<PathBuf> {
    let dir = models_root().join(model);
    if dir.join("config.json").is_file() {
        return Some(dir);
    }
    assert!(std::env::var("CI").map_or(true, |v| v != "true"), "{} is missing under CI", dir.display());
    let reason = format!("model {model} is not present (set MONOGEN_MODELS)");
    eprintln!("skipped {test}: {reason}");
    if let Some(log) = std::env::var_os("MONOGEN_SKIP_LOG") {
        use std::io::Write;
        let mut log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        log.write_all(format!("{reason}\t{test}\n").as_bytes()).unwrap();
    }
    None
}

/// `monogen ARGS` in `root`, untouched by the environment's `MONOGEN_ROOT` and `MONOGEN_FAULT`.
pub fn command(root: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_monogen"));
    command
        .args(args)
        .current_dir(root)
        .env_remove("MONOGEN_ROOT")
        .env_remove("MONOGEN_FAULT")
        .env("MONOGEN_BENCH_TARGET_DIR", workspace_root().join("target/monogen-bench-tests"))
        // The crates and harnesses these tests build in release are judged by verdicts between
        // kernels 5-10x apart, not by their speed: built without LTO and in parallel, they
        // compile in a fraction of the time their one code unit takes.
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16");
    command
}

pub fn monogen(root: &Path, args: &[&str]) -> Output {
    command(root, args).output().expect("monogen runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else {
            std::fs::copy(&path, to.join(entry.file_name())).unwrap();
        }
    }
}

/// A scratch repository: the registry, the templates and the default workload, without its
/// hardware class, so that declared priorities choose (these tests are about writing).
pub fn scratch_repo() -> tempfile::TempDir {
    let temp = measured_repo();
    let path = temp.path().join(WORKLOAD);
    let text = std::fs::read_to_string(&path).unwrap();
    let without: Vec<&str> = text.lines().filter(|l| !l.starts_with("hardware = ")).collect();
    std::fs::write(&path, without.join("\n") + "\n").unwrap();
    temp
}

/// A scratch repository with the default workload as committed (hardware class included) and
/// the ranking database.
pub fn measured_repo() -> tempfile::TempDir {
    let temp = tempfile::tempdir().unwrap();
    for dir in ["interfaces", "implementations", "templates", "rankings"] {
        copy_dir(&workspace_root().join(dir), &temp.path().join(dir));
    }
    std::fs::create_dir(temp.path().join("workloads")).unwrap();
    std::fs::copy(workspace_root().join(WORKLOAD), temp.path().join(WORKLOAD)).unwrap();
    temp
}

pub const WORKLOAD: &str = "workloads/stories260k-cpu-f32.toml";

/// The text of the committed workload `rel` (under the workspace root) with `hardware` set to
/// this machine's class, so that `bench` runs for it here.
pub fn for_this_class(rel: &str) -> String {
    let class = monogen::host::this_class();
    let text = std::fs::read_to_string(workspace_root().join(rel)).unwrap();
    let lines: Vec<String> = text
        .lines()
        .map(|l| if l.starts_with("hardware = ") { format!("hardware = \"{class}\"") } else { l.to_string() })
        .collect();
    lines.join("\n") + "\n"
}

pub fn read_tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}
