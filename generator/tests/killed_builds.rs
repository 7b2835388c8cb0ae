//! Real faults: `monogen build` killed with SIGKILL at many moments of its write (a child
//! process, killed after a random delay from the moment its staging directory appears), and
//! the `monogen check` that recovers from it killed too, before one runs to its end. After
//! each round the crate's directory must hold the previous generation or the new one, whole,
//! byte for byte, with no staging directory left; a kill before the commit point must leave
//! the previous generation untouched even before recovery.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Rounds of kill and recovery.
const ROUNDS: usize = 10;

fn spawn(root: &Path, args: &[&str]) -> Child {
    command(root, args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("monogen runs")
}

/// A small deterministic generator (xorshift64*), seeded per run and printed, so that a
/// failing round can be replayed with `MONOGEN_KILL_SEED`.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) % n.max(1)
    }
}

/// Waits (polling) until `path` exists or `child` has exited; returns whether it appeared.
fn wait_for(path: &Path, child: &mut Child) -> bool {
    loop {
        if path.exists() {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::yield_now();
    }
}

fn tree_without_staging(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    read_tree(dir).into_iter().filter(|(p, _)| !p.starts_with(".monogen-staging")).collect()
}

/// Puts generation `tree` back into `dir` as it was (files monogen wrote, nothing else).
fn restore(dir: &Path, tree: &[(PathBuf, Vec<u8>)]) {
    std::fs::remove_dir_all(dir).unwrap();
    for (path, bytes) in tree {
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, bytes).unwrap();
    }
}

/// What makes `tree` neither generation: the paths of files that are in neither, or missing.
fn neither(tree: &[(PathBuf, Vec<u8>)], old: &[(PathBuf, Vec<u8>)], new: &[(PathBuf, Vec<u8>)]) -> String {
    let foreign: Vec<_> = tree
        .iter()
        .filter(|f| !old.contains(f) && !new.contains(f))
        .map(|f| f.0.display().to_string())
        .collect();
    let mixed: Vec<_> = tree
        .iter()
        .filter(|f| old.contains(f) != new.contains(f))
        .map(|f| format!("{} ({})", f.0.display(), if old.contains(f) { "old" } else { "new" }))
        .collect();
    format!("neither generation: files of neither {foreign:?}; files of one only {mixed:?}")
}

#[cfg(unix)]
#[test]
fn builds_killed_at_random_moments_leave_one_generation_whole() {
    let repo = scratch_repo();
    let root = repo.path();
    let crate_dir = root.join("generated/stories260k-cpu-f32");
    let staging = crate_dir.join(".monogen-staging");
    let workload = root.join(WORKLOAD);
    let old_text = std::fs::read_to_string(&workload).unwrap();
    // The new generation: 5 threads (lib.rs and the README change) and no AVX2 (every kernel
    // changes, and the shared AVX2 helpers are removed).
    let start = old_text.find("cpu_features = [").unwrap();
    let end = start + old_text[start..].find(']').unwrap() + 1;
    let new_text = format!("{}cpu_features = []{}", &old_text[..start], &old_text[end..])
        .replace("threads = 2", "threads = 5");

    std::fs::write(&workload, &new_text).unwrap();
    assert!(monogen(root, &["build", WORKLOAD]).status.success());
    let new = read_tree(&crate_dir);
    std::fs::write(&workload, &old_text).unwrap();
    assert!(monogen(root, &["build", WORKLOAD]).status.success());
    let old = read_tree(&crate_dir);
    let removed = old.iter().filter(|(p, _)| !new.iter().any(|(q, _)| q == p)).count();
    let changed = old.iter().filter(|f| new.iter().any(|g| g.0 == f.0 && g.1 != f.1)).count();
    assert!(removed > 0 && changed > 5, "the new generation removes {removed} files, changes {changed}");

    // How long a build writes: from its staging directory's appearance to its exit, and from
    // its journal's (the commit point) to its exit.
    let journal = staging.join("journal");
    std::fs::write(&workload, &new_text).unwrap();
    let mut child = spawn(root, &["build", WORKLOAD]);
    assert!(wait_for(&staging, &mut child), "the build staged nothing");
    let writing = Instant::now();
    // The journal lives for a few milliseconds: a poll that misses it (this thread descheduled
    // meanwhile) takes half the write for the part past the commit point.
    let committed = wait_for(&journal, &mut child).then(Instant::now);
    assert!(child.wait().unwrap().success());
    let write_span = writing.elapsed().max(Duration::from_millis(1));
    let apply_span = committed.map_or(write_span / 2, |c| c.elapsed()).max(Duration::from_micros(100));
    restore(&crate_dir, &old);

    let seed = std::env::var("MONOGEN_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    eprintln!(
        "MONOGEN_KILL_SEED={seed}; a build writes for {write_span:?}, {apply_span:?} of it past its commit point"
    );
    let mut rng = Rng(seed);
    let (mut kept_old, mut got_new, mut before_commit, mut recoveries_killed) = (0, 0, 0, 0);
    for round in 0..ROUNDS {
        // Kill the build at a random moment of its write, every other round at a random moment
        // past its commit point (renames, removals, the staging directory's deletion), each
        // window stretched by a tenth so that some kills come after the end.
        let (mark, span) = if round % 2 == 0 { (&staging, write_span) } else { (&journal, apply_span) };
        let delay = Duration::from_micros(rng.below(span.as_micros() as u64 * 11 / 10 + 1));
        let mut child = spawn(root, &["build", WORKLOAD]);
        if wait_for(mark, &mut child) {
            std::thread::sleep(delay);
        }
        let _ = child.kill();
        child.wait().unwrap();
        let what = format!("round {round} (seed {seed}, killed {delay:?} after {} appeared)", mark.display());
        // A staging directory without a journal: killed before the commit point (the previous
        // generation untouched), or while the staging directory of a finished build was being
        // deleted (the new one in place).
        if staging.exists() && !journal.exists() {
            let tree = tree_without_staging(&crate_dir);
            if tree == old {
                before_commit += 1;
            } else {
                assert!(tree == new, "{what}: no journal, yet {}", neither(&tree, &old, &new));
            }
        }

        // Recovery (`check` completes a committed build or discards an uncommitted one),
        // killed up to twice within its first milliseconds, then run to its end.
        for _ in 0..rng.below(3) {
            let mut check = spawn(root, &["check", WORKLOAD]);
            std::thread::sleep(Duration::from_micros(rng.below(write_span.as_micros() as u64 + 2000)));
            let _ = check.kill();
            check.wait().unwrap();
            recoveries_killed += 1;
        }
        let out = monogen(root, &["check", WORKLOAD]);
        assert!(matches!(out.status.code(), Some(0 | 1)), "{what}: check failed: {}", stderr(&out));
        assert!(!staging.exists(), "{what}: the staging directory is left after recovery");
        let tree = read_tree(&crate_dir);
        if tree == old {
            kept_old += 1;
        } else if tree == new {
            got_new += 1;
        } else {
            panic!("{what}: {}", neither(&tree, &old, &new));
        }
        restore(&crate_dir, &old);
    }
    eprintln!(
        "{ROUNDS} kills: {kept_old} left the previous generation ({before_commit} seen before the commit \
         point), {got_new} the new one; {recoveries_killed} recoveries killed"
    );
}
