//! A deployment repository, end to end: crates generated with `--out` into another repository,
//! checked and regenerated there with `--crate`, measured into that repository's own rankings
//! with `bench --stale`, all driven by the steps of docs/ci/deployment.yml, the workflow that
//! the README tells such a repository to copy.
//!
//! The workflow's steps run as GitHub runs them (`bash -eo pipefail`, its `env`, `GITHUB_ENV`,
//! `GITHUB_PATH`), in a scratch git repository whose `origin` is a bare repository beside it.
//! Two kinds of step do not run: `uses:` steps (the scratch repository is already checked out,
//! and this test runs under cargo's toolchain) and the step that clones and builds monogen at
//! the pinned revision, which needs the network; in its place the test does what it leaves
//! behind: `monogen` on the PATH and `MONOGEN_ROOT` naming a copy of the registry, which the
//! test edits as an upstream change would.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

const WORKFLOW: &str = "docs/ci/deployment.yml";
const FETCH_STEP: &str = "Fetch and build monogen at the pinned revision";
const CRATE: &str = "crates/s260";

/// One step of a job of the workflow.
#[derive(Debug)]
struct Step {
    job: String,
    name: String,
    run: Option<String>,
    uses: Option<String>,
}

/// The workflow's top-level `env` and its steps, read from the subset of YAML the file uses
/// (block mappings, `- ` step lists, `run: |` block scalars). A line this reader does not
/// understand fails the test, so that the file cannot drift out of what the test runs.
struct Workflow {
    env: Vec<(String, String)>,
    steps: Vec<Step>,
}

fn unquote(value: &str) -> String {
    let value = match value.find(" #") {
        Some(i) if !value.starts_with('"') => &value[..i],
        _ => value,
    };
    value.trim().trim_matches('"').to_string()
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn parse_workflow(text: &str) -> Workflow {
    let lines: Vec<&str> = text.lines().collect();
    let mut env = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    let mut section = "";
    let mut job = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim();
        i += 1;
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let depth = indent(line);
        if depth == 0 {
            section = trimmed.split(':').next().unwrap();
            continue;
        }
        match (section, depth) {
            ("env", 2) => {
                let (key, value) = trimmed.split_once(':').expect("env entries are `KEY: value`");
                env.push((key.to_string(), unquote(value)));
            }
            ("jobs", 2) => job = trimmed.trim_end_matches(':').to_string(),
            ("jobs", 6) if trimmed.starts_with("- ") => {
                steps.push(Step { job: job.clone(), name: String::new(), run: None, uses: None });
                let (key, value) = trimmed[2..].split_once(':').expect("a step starts with `- key: value`");
                set_step_key(steps.last_mut().unwrap(), key, value, &lines, &mut i);
            }
            ("jobs", 8) if !steps.is_empty() && steps.last().unwrap().job == job => {
                let (key, value) = trimmed.split_once(':').expect("step entries are `key: value`");
                set_step_key(steps.last_mut().unwrap(), key, value, &lines, &mut i);
            }
            // Job settings (runs-on, needs, if, steps:) and the `with:` of a step.
            ("jobs", _) | ("on", _) | ("permissions", _) => {}
            _ => panic!("{WORKFLOW}: unexpected line {i}: {line}"),
        }
    }
    Workflow { env, steps }
}

fn set_step_key(step: &mut Step, key: &str, value: &str, lines: &[&str], i: &mut usize) {
    let value = value.trim();
    match key {
        "name" => step.name = unquote(value),
        "uses" => step.uses = Some(unquote(value)),
        "run" if value == "|" => {
            let mut script = String::new();
            while *i < lines.len() && (lines[*i].trim().is_empty() || indent(lines[*i]) > 8) {
                script.push_str(lines[*i].get(10..).unwrap_or(""));
                script.push('\n');
                *i += 1;
            }
            step.run = Some(script);
        }
        "run" => step.run = Some(value.to_string()),
        // `with:` (its entries are deeper), `if:`, `id:`, comments.
        _ => {}
    }
}

/// A scratch deployment repository with a bare `origin`, the copy of the registry that stands
/// for the pinned monogen revision, and the files the workflow's steps write to.
struct Deployment {
    _temp: tempfile::TempDir,
    repo: PathBuf,
    origin: PathBuf,
    monogen_root: PathBuf,
    github_env: PathBuf,
    workflow: Workflow,
}

/// What one job did: each step that ran, with its output.
struct JobRun {
    steps: Vec<(String, Output)>,
}

impl JobRun {
    fn step(&self, name: &str) -> &Output {
        &self.steps.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no step `{name}` ran")).1
    }

    fn failed(&self) -> Option<&(String, Output)> {
        self.steps.iter().find(|(_, o)| !o.status.success())
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").args(args).current_dir(dir).output().expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
    stdout(&out)
}

impl Deployment {
    fn new() -> Deployment {
        let temp = tempfile::tempdir().unwrap();
        let monogen_root = temp.path().join("monogen");
        for dir in ["interfaces", "implementations", "templates", "rankings"] {
            copy_dir(&workspace_root().join(dir), &monogen_root.join(dir));
        }
        // The lock file harnesses are built with, whose versions records name.
        std::fs::copy(workspace_root().join("Cargo.lock"), monogen_root.join("Cargo.lock")).unwrap();
        let origin = temp.path().join("origin.git");
        let repo = temp.path().join("deploy");
        std::fs::create_dir_all(&repo).unwrap();
        git(temp.path(), &["init", "--quiet", "--bare", origin.to_str().unwrap()]);
        git(&repo, &["init", "--quiet", "--initial-branch=main"]);
        git(&repo, &["config", "user.name", "test"]);
        git(&repo, &["config", "user.email", "test@example.com"]);
        git(&repo, &["remote", "add", "origin", origin.to_str().unwrap()]);
        let text = std::fs::read_to_string(workspace_root().join(WORKFLOW)).unwrap();
        let workflow = parse_workflow(&text);
        std::fs::create_dir_all(repo.join(".github/workflows")).unwrap();
        std::fs::write(repo.join(".github/workflows/monogen.yml"), &text).unwrap();
        let github_env = temp.path().join("github_env");
        Deployment { repo, origin, monogen_root, github_env, workflow, _temp: temp }
    }

    /// `monogen ARGS` in the deployment repository, as the README's walk-through runs it.
    fn monogen(&self, args: &[&str]) -> Output {
        command(&self.repo, args)
            .env("MONOGEN_ROOT", &self.monogen_root)
            .env("MONOGEN_RANKINGS", "rankings")
            .output()
            .expect("monogen runs")
    }

    /// Runs the steps of `job` in order, as GitHub would, stopping at the first that fails.
    fn run_job(&self, job: &str) -> JobRun {
        let steps: Vec<&Step> = self.workflow.steps.iter().filter(|s| s.job == job).collect();
        assert!(!steps.is_empty(), "{WORKFLOW} has no job `{job}`");
        let fetch = steps.iter().find(|s| s.name == FETCH_STEP).unwrap_or_else(|| {
            panic!("job `{job}` of {WORKFLOW} has no step `{FETCH_STEP}`, which this test stands in for")
        });
        // What that step leaves for the steps after it, which this test provides instead.
        let script = fetch.run.as_deref().unwrap();
        assert!(
            script.contains("MONOGEN_ROOT=")
                && script.contains("GITHUB_ENV")
                && script.contains("GITHUB_PATH"),
            "{FETCH_STEP} no longer exports MONOGEN_ROOT and the PATH, which this test provides:\n{script}"
        );
        let bin = Path::new(env!("CARGO_BIN_EXE_monogen")).parent().unwrap().to_path_buf();
        let path = std::env::join_paths(
            std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )
        .unwrap();
        std::fs::write(&self.github_env, format!("MONOGEN_ROOT={}\n", self.monogen_root.display())).unwrap();
        let mut run = JobRun { steps: Vec::new() };
        for step in steps {
            let (Some(script), None) = (&step.run, &step.uses) else { continue };
            if step.name == FETCH_STEP {
                continue;
            }
            let mut command = Command::new("bash");
            command
                .args(["--noprofile", "--norc", "-eo", "pipefail", "-c", script])
                .current_dir(&self.repo)
                .env_remove("MONOGEN_FAULT")
                .env_remove("MONOGEN_RANKINGS")
                .env_remove("GITHUB_HEAD_REF")
                .env("PATH", &path)
                .env("GITHUB_ENV", &self.github_env)
                .env("MONOGEN_BENCH_TARGET_DIR", workspace_root().join("target/monogen-bench-tests"));
            for (key, value) in &self.workflow.env {
                command.env(key, value);
            }
            for line in std::fs::read_to_string(&self.github_env).unwrap().lines() {
                let (key, value) = line.split_once('=').unwrap();
                command.env(key, value);
            }
            let out = command.output().expect("bash runs");
            let failed = !out.status.success();
            run.steps.push((step.name.clone(), out));
            if failed {
                break;
            }
        }
        run
    }

    fn lock(&self) -> String {
        std::fs::read_to_string(self.repo.join(CRATE).join("monogen.lock")).unwrap()
    }
}

fn show(run: &JobRun) -> String {
    run.steps
        .iter()
        .map(|(n, o)| format!("--- {n} ({}):\n{}{}", o.status, stdout(o), stderr(o)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A change to a file's text.
type Edit = Box<dyn Fn(&str) -> String>;

/// The chosen implementation of `interface` in a lock file's text.
fn chosen(lock: &str, interface: &str) -> String {
    let lock: toml::Table = toml::from_str(lock).unwrap();
    let choice =
        lock["choice"].as_array().unwrap().iter().find(|c| c["interface"].as_str() == Some(interface));
    choice.unwrap()["implementation"].as_str().unwrap().to_string()
}

fn ranking_files(dir: &Path) -> BTreeMap<String, String> {
    read_tree(dir)
        .into_iter()
        .map(|(p, bytes)| (p.display().to_string(), String::from_utf8(bytes).unwrap()))
        .collect()
}

#[test]
fn the_workflow_keeps_a_deployment_repository_fresh_through_an_upstream_kernel_edit() {
    let d = Deployment::new();
    let class = monogen::host::this_class();
    // The README's walk-through: a workload for this machine's class, its crate generated into
    // the deployment repository, committed.
    let workload = for_this_class(WORKLOAD);
    std::fs::write(d.repo.join("s260.toml"), &workload).unwrap();
    let built = d.monogen(&["build", "s260.toml", "--out", CRATE]);
    assert!(built.status.success(), "{}", stderr(&built));
    assert_eq!(
        std::fs::read_to_string(d.repo.join(CRATE).join("workload.toml")).unwrap(),
        workload,
        "the crate keeps its workload as written"
    );
    git(&d.repo, &["add", "-A"]);
    git(&d.repo, &["commit", "--quiet", "-m", "add the crate"]);

    // Nothing is measured yet on this class in the repository's own rankings.
    let check = d.run_job("check");
    let (name, out) = check.failed().unwrap_or_else(|| panic!("check passed unmeasured:\n{}", show(&check)));
    assert_eq!(name, "Every crate is what monogen would write");
    assert_eq!(out.status.code(), Some(1), "{}", show(&check));
    let fix = format!(
        "fix: monogen bench --stale --crate {CRATE} (on hardware class {class}), then monogen build --crate {CRATE}"
    );
    assert!(stdout(out).contains(&fix), "{}", show(&check));

    // The regenerate job measures everything, regenerates, checks, and pushes for review.
    let regenerate = d.run_job("regenerate");
    assert!(regenerate.failed().is_none(), "{}", show(&regenerate));
    let measured = stderr(regenerate.step("Measure what is stale"));
    assert!(measured.contains("measuring the stale interfaces rmsnorm, matmul"), "{measured}");
    // An f32 crate has no quality bar to evaluate against (cli.rs tests the crates that do).
    let evaluated = stdout(regenerate.step("Evaluate the crates whose numerics changed"));
    assert!(evaluated.contains(&format!("{CRATE}: nothing to evaluate (f32 weights")), "{evaluated}");
    let pushed = git(&d.origin, &["ls-tree", "-r", "--name-only", "monogen/refresh"]);
    assert!(pushed.contains(&format!("rankings/{class}/matmul.toml")), "{pushed}");
    assert!(pushed.contains(&format!("{CRATE}/monogen.lock")), "{pushed}");
    assert!(d.run_job("check").failed().is_none(), "fresh after regenerating");
    let rankings_before = ranking_files(&d.repo.join("rankings"));
    let lock_before = d.lock();

    // Documentation upstream changes no choice and no key: nothing goes stale.
    let matmul = chosen(&lock_before, "matmul");
    let kernel_dir = d.monogen_root.join("implementations/matmul").join(&matmul);
    std::fs::write(kernel_dir.join("README.md"), "Notes on this kernel.\n").unwrap();
    let check = d.run_job("check");
    assert!(check.failed().is_none(), "a README stales nothing:\n{}", show(&check));

    // Every other input of a record's key, changed alone, fails the check naming it; undone,
    // the check passes again.
    let matmul_records =
        std::fs::read_to_string(d.repo.join(format!("rankings/{class}/matmul.toml"))).unwrap();
    assert!(matmul_records.contains("harness_sha256 = "), "{matmul_records}");
    let records: toml::Table = toml::from_str(&matmul_records).unwrap();
    let gemm_record = records["record"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["implementation"].as_str() == Some("gemm-crate"))
        .expect("gemm-crate was measured");
    let dependencies: Vec<&str> =
        gemm_record["dependencies"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert!(dependencies.len() > 1, "the kernel's dependencies and theirs: {dependencies:?}");
    let gemm_version =
        dependencies.iter().find_map(|d| d.strip_prefix("gemm ")).expect("gemm is among them").to_string();
    // A competitor of the chosen matmul, edited upstream: the registry's revision for matmul,
    // which the lock records, and the competitor's record both change.
    let rival = records["record"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["implementation"].as_str())
        .find(|name| *name != matmul)
        .expect("matmul has a measured competitor")
        .to_string();
    let changes: [(&str, PathBuf, Edit, String); 4] = [
        (
            "a competitor's kernel",
            d.monogen_root.join("implementations/matmul").join(&rival).join("kernel.rs"),
            Box::new(|t: &str| format!("{t}\n// An edit.\n")),
            "matmul: its candidates in the registry changed (an implementation of it was added, removed or edited".to_string(),
        ),
        (
            "the benchmark harness",
            d.monogen_root.join("templates/bench/harness.rs"),
            Box::new(|t: &str| format!("{t}\n// An edit.\n")),
            "the benchmark harness (templates/bench/) changed since it was measured: re-measure".to_string(),
        ),
        (
            "a dependency's version",
            d.monogen_root.join("Cargo.lock"),
            Box::new({
                let from = format!("name = \"gemm\"\nversion = \"{gemm_version}\"");
                move |t: &str| t.replacen(&from, "name = \"gemm\"\nversion = \"0.19.999\"", 1)
            }),
            format!(
                "matmul/gemm-crate's measurements on {class} are stale: gemm {gemm_version} → 0.19.999 (Cargo.lock): re-measure"
            ),
        ),
        (
            "the toolchain",
            d.repo.join("rust-toolchain.toml"),
            Box::new(|_: &str| "[toolchain]\nchannel = \"1.0.0\"\n".to_string()),
            "→ 1.0.0 (rust-toolchain.toml): re-measure".to_string(),
        ),
    ];
    for (what, file, change, said) in &changes {
        let before = std::fs::read_to_string(file).ok();
        let changed = change(before.as_deref().unwrap_or_default());
        assert_ne!(Some(&changed), before.as_ref(), "{what}: the change changes nothing");
        std::fs::write(file, changed).unwrap();
        let check = d.run_job("check");
        let out = check.failed().unwrap_or_else(|| panic!("{what}: went unnoticed:\n{}", show(&check)));
        assert!(stdout(&out.1).contains(said.as_str()), "{what}: {}", show(&check));
        match &before {
            Some(text) => std::fs::write(file, text).unwrap(),
            None => std::fs::remove_file(file).unwrap(),
        }
        assert!(d.run_job("check").failed().is_none(), "{what}: undone, fresh again");
    }

    // An upstream kernel edit: the crate's check fails naming the kernel and the fix.
    let kernel = kernel_dir.join("kernel.rs");
    let mut source = std::fs::read_to_string(&kernel).unwrap();
    source.push_str("\n// An upstream edit.\n");
    std::fs::write(&kernel, source).unwrap();
    let check = d.run_job("check");
    let (_, out) =
        check.failed().unwrap_or_else(|| panic!("a kernel edit went unnoticed:\n{}", show(&check)));
    assert_eq!(out.status.code(), Some(1));
    let report = stdout(out);
    assert!(report.contains(&format!("STALE   {CRATE} ({CRATE}/workload.toml)")), "{report}");
    assert!(
        report.contains(&format!(
            "matmul/{matmul}'s measurements on {class} are stale: its source (kernel.rs or a shared module it uses) changed"
        )),
        "{report}"
    );
    assert!(report.contains(&fix), "{report}");

    // bench --stale measures matmul alone; build --crate and check then pass.
    let regenerate = d.run_job("regenerate");
    assert!(regenerate.failed().is_none(), "{}", show(&regenerate));
    let measured = stderr(regenerate.step("Measure what is stale"));
    assert!(measured.contains("measuring the stale interfaces matmul\n"), "{measured}");
    let rankings_after = ranking_files(&d.repo.join("rankings"));
    let changed: Vec<&String> =
        rankings_after.iter().filter(|(p, t)| rankings_before.get(*p) != Some(t)).map(|(p, _)| p).collect();
    assert_eq!(changed, [&format!("{class}/matmul.toml")], "only matmul was measured again");
    let lock_after = d.lock();
    if chosen(&lock_after, "matmul") == matmul {
        assert_ne!(lock_after, lock_before, "the lock records the edited kernel's hash");
    }
    let log = git(&d.origin, &["log", "--format=%s", "monogen/refresh"]);
    assert_eq!(log.lines().count(), 3, "{log}");
    let check = d.run_job("check");
    assert!(check.failed().is_none(), "fresh after regenerating:\n{}", show(&check));

    // With nothing stale, `bench --stale` measures nothing and says so, for tools too.
    let out = d.monogen(&["bench", "--stale", "--json", "--crate", CRATE]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["stale"]["state"], "fresh", "{doc}");
    assert_eq!(doc["skipped"], "every record its choices rest on is fresh", "{doc}");
}

/// A workload edit in the deployment repository, as its users make them: `check --crate` says
/// so, `build --crate` takes it, and an old-style `build --out` would not overwrite it.
#[test]
fn a_crates_own_workload_is_its_input() {
    let repo = scratch_repo();
    let out = repo.path().join("deploy/crates/s260");
    let built = monogen(repo.path(), &["build", WORKLOAD, "--out", out.to_str().unwrap()]);
    assert!(built.status.success(), "{}", stderr(&built));
    let check = monogen(repo.path(), &["check", "--crate", out.to_str().unwrap()]);
    assert!(check.status.success(), "{}", stdout(&check));

    let copy = out.join("workload.toml");
    let text = std::fs::read_to_string(&copy).unwrap();
    std::fs::write(&copy, text.replace("typical_decode_len = 128", "typical_decode_len = 100")).unwrap();
    let check = monogen(repo.path(), &["check", "--crate", out.to_str().unwrap()]);
    assert_eq!(check.status.code(), Some(1));
    let report = stdout(&check);
    assert!(report.contains("because the workload changed"), "{report}");
    assert!(report.contains("fix: monogen build --crate "), "{report}");
    assert!(!report.contains("workload.toml (edited by hand)"), "the copy is an input: {report}");

    // The repository's workload would overwrite the edited copy: refused, saying how.
    let over = monogen(repo.path(), &["build", WORKLOAD, "--out", out.to_str().unwrap()]);
    assert_eq!(over.status.code(), Some(2));
    let e = stderr(&over);
    assert!(e.contains("edited by hand") && e.contains("workload.toml") && e.contains("--crate"), "{e}");

    let rebuilt = monogen(repo.path(), &["build", "--crate", out.to_str().unwrap()]);
    assert!(rebuilt.status.success(), "{}", stderr(&rebuilt));
    let lock = std::fs::read_to_string(out.join("monogen.lock")).unwrap();
    assert!(lock.contains("typical_decode_len = 100"), "{lock}");
    let check = monogen(repo.path(), &["check", "--crate", out.to_str().unwrap()]);
    assert!(check.status.success(), "{}", stdout(&check));
    let explain = monogen(repo.path(), &["explain", "--crate", out.to_str().unwrap()]);
    assert!(stdout(&explain).contains("typical prompt 128, decode 100"), "{}", stdout(&explain));
}

#[test]
fn check_crate_names_what_is_not_a_crate() {
    let repo = scratch_repo();
    let not_a_crate = repo.path().join("templates");
    let out = monogen(repo.path(), &["check", "--crate", not_a_crate.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .contains("is not a crate monogen generated (it has no monogen.lock and no workload.toml)")
    );
    let missing = repo.path().join("nowhere");
    let out = monogen(repo.path(), &["build", "--crate", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("does not exist; --crate takes the folder of a crate monogen generated"));

    // A crate generated before crates kept their workload: the lock is there, the copy is not.
    let dir = repo.path().join("generated/old");
    let built = monogen(repo.path(), &["build", WORKLOAD, "--out", dir.to_str().unwrap()]);
    assert!(built.status.success(), "{}", stderr(&built));
    std::fs::remove_file(dir.join("workload.toml")).unwrap();
    let out = monogen(repo.path(), &["check", "--crate", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(e.contains("has no workload.toml") && e.contains("--out"), "{e}");
}
