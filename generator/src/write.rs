//! Writing a generated crate to disk: only what changed, never half of it, never over a
//! hand edit.
//!
//! A build is a small transaction inside the output directory:
//! 1. every new or changed file is written to `.monogen-staging/` and synced;
//! 2. a journal listing the renames and removals is written and renamed into place: the
//!    commit point;
//! 3. the staged files are renamed over their targets and stale files are removed;
//! 4. the staging directory is deleted.
//!
//! A build interrupted before the commit point leaves the previous generation untouched
//! (the next run discards the staging directory); one interrupted after it is completed by
//! the next run of `build` or `check`. Files that monogen did not write (`Cargo.lock`,
//! `target/`, anything else) are never touched.
//!
//! Every other file monogen writes (rankings, workloads from `init`, model folders from
//! `synth-weights`, the benchmark harness) goes through [`write_file`], [`write_file_with`]
//! or [`sync_folder`]: written beside its target and renamed over it, and only if it changed.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::Error;
use crate::emit::{HeaderStatus, Output, check_header};
use crate::lock::{LOCK_FILE, Lock, ReadError};

/// Name of the staging directory inside an output directory.
pub const STAGING_DIR: &str = ".monogen-staging";
const JOURNAL: &str = "journal";

/// What a write did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteReport {
    pub created: Vec<PathBuf>,
    pub updated: Vec<PathBuf>,
    pub removed: Vec<PathBuf>,
    pub unchanged: usize,
}

impl WriteReport {
    pub fn changed(&self) -> bool {
        !(self.created.is_empty() && self.updated.is_empty() && self.removed.is_empty())
    }
}

/// How the files on disk differ from a generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Files the generation has and the directory lacks.
    pub missing: Vec<PathBuf>,
    /// Files whose contents differ.
    pub modified: Vec<PathBuf>,
    /// Files an earlier generation wrote that this one does not.
    pub stale: Vec<PathBuf>,
    /// Files that differ because someone edited them by hand.
    pub hand_edited: Vec<PathBuf>,
}

impl Diff {
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.modified.is_empty() && self.stale.is_empty()
    }
}

/// The files the generation in `dir` wrote, from its monogen.lock, each with the sha256 the
/// lock records of it (none for the lock itself); `None` without a lock.
pub fn previous_files(dir: &Path) -> Result<Option<BTreeMap<PathBuf, Option<String>>>, Error> {
    let lock_path = dir.join(LOCK_FILE);
    let lock = match Lock::read(dir) {
        Ok(lock) => lock,
        Err(ReadError::Missing) => return Ok(None),
        Err(ReadError::Io(e)) => return Err(Error::io(&lock_path, e)),
        Err(ReadError::Malformed(e)) => {
            return Err(Error::Refused(format!(
                "{} cannot be read ({e}); it is how monogen knows which files it wrote. Restore it, or pass --force to write the crate anyway",
                lock_path.display(),
            )));
        }
    };
    let hashes: BTreeMap<PathBuf, String> =
        lock.file.iter().map(|f| (PathBuf::from(&f.path), f.sha256.clone())).collect();
    let files = lock.files(&lock_path)?.into_iter().map(|p| {
        let sha = hashes.get(&p).cloned();
        (p, sha)
    });
    Ok(Some(files.collect()))
}

/// Whether `on_disk`, a file of a generated crate, was changed by hand since monogen wrote it:
/// its `@generated` header's hash no longer matches its body, and it is not the file the
/// previous generation recorded (`recorded`, from its monogen.lock). The second test is the
/// only one for the crate's copy of its workload, which has no header: it is an input, which
/// `build --crate` reads and a person may edit.
fn edited_by_hand(on_disk: &[u8], recorded: Option<&Option<String>>) -> bool {
    check_header(&String::from_utf8_lossy(on_disk)) != HeaderStatus::Intact
        && recorded.and_then(Option::as_ref).is_none_or(|sha| *sha != crate::registry::sha256_hex(on_disk))
}

/// Compares `output` with what `dir` holds (after completing an interrupted build).
pub fn diff(dir: &Path, output: &Output) -> Result<Diff, Error> {
    let _lock = if dir.is_dir() { Some(DirLock::acquire(dir)?) } else { None };
    recover(dir)?;
    // An unreadable lock shows up as a modified monogen.lock; `check` says why.
    let previous = previous_files(dir).ok().flatten().unwrap_or_default();
    let mut d = Diff::default();
    for (path, contents) in &output.files {
        match fs::read(dir.join(path)) {
            Ok(on_disk) if on_disk == contents.as_bytes() => {}
            Ok(on_disk) => {
                if edited_by_hand(&on_disk, previous.get(path)) {
                    d.hand_edited.push(path.clone());
                }
                d.modified.push(path.clone());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => d.missing.push(path.clone()),
            Err(e) => return Err(Error::io(&dir.join(path), e)),
        }
    }
    for path in previous.keys().filter(|p| !output.files.contains_key(*p)) {
        if dir.join(path).exists() {
            d.stale.push(path.clone());
        }
    }
    Ok(d)
}

/// Holds an advisory lock on an output directory, so that two monogen processes never
/// write (or recover) the same crate at once. Released when dropped.
struct DirLock(fs::File);

impl DirLock {
    fn acquire(dir: &Path) -> Result<DirLock, Error> {
        let handle = fs::File::open(dir).map_err(|e| Error::io(dir, e))?;
        match handle.try_lock() {
            Ok(()) => Ok(DirLock(handle)),
            Err(fs::TryLockError::WouldBlock) => Err(Error::Refused(format!(
                "another monogen process is writing {}; wait for it to finish",
                dir.display()
            ))),
            Err(fs::TryLockError::Error(e)) => Err(Error::io(dir, e)),
        }
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Writes `output` into `dir`. Refuses to overwrite hand-edited files, and to write into a
/// non-empty directory that monogen did not generate, unless `force`.
pub fn write(dir: &Path, output: &Output, force: bool) -> Result<WriteReport, Error> {
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let _lock = DirLock::acquire(dir)?;
    recover(dir)?;
    let previous = match previous_files(dir) {
        Ok(p) => p,
        // With --force an unreadable lock is ignored: nothing it lists is protected.
        Err(_) if force => None,
        Err(e) => return Err(e),
    };
    if previous.is_none() && !force && dir_has_entries(dir)? {
        return Err(Error::Refused(format!(
            "{} is not empty and holds no {LOCK_FILE}, so it is not a crate monogen generated; refusing to write into it. Choose another --out, empty it, or pass --force (files monogen does not generate are left alone)",
            dir.display()
        )));
    }
    if let (Some(_), false) = (&previous, force) {
        let name = |text: &str| Lock::parse(text).ok().and_then(|l| l.workload_name().map(String::from));
        let old = fs::read_to_string(dir.join(LOCK_FILE)).ok().as_deref().and_then(name);
        let new = output.files.get(Path::new(LOCK_FILE)).and_then(|t| name(t));
        if let (Some(old), Some(new)) = (old, new)
            && old != new
        {
            return Err(Error::Refused(format!(
                "{} holds the crate of workload `{old}`, not `{new}`; refusing to replace it. Give the workload its own name or --out, or pass --force",
                dir.display()
            )));
        }
    }
    let previous = previous.unwrap_or_default();

    let mut writes: BTreeMap<&Path, &str> = BTreeMap::new();
    let mut report = WriteReport::default();
    let mut edited = Vec::new();
    for (path, contents) in &output.files {
        let target = dir.join(path);
        match fs::read(&target) {
            Ok(on_disk) if on_disk == contents.as_bytes() => report.unchanged += 1,
            Ok(on_disk) => {
                if edited_by_hand(&on_disk, previous.get(path)) {
                    edited.push(path.clone());
                }
                report.updated.push(path.clone());
                writes.insert(path, contents);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                report.created.push(path.clone());
                writes.insert(path, contents);
            }
            Err(e) => return Err(Error::io(&target, e)),
        }
    }
    for (path, recorded) in previous.iter().filter(|(p, _)| !output.files.contains_key(*p)) {
        let target = dir.join(path);
        match fs::read(&target) {
            Ok(on_disk) => {
                if edited_by_hand(&on_disk, Some(recorded)) {
                    edited.push(path.clone());
                }
                report.removed.push(path.clone());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&target, e)),
        }
    }
    if !edited.is_empty() && !force {
        let list: Vec<String> = edited.iter().map(|p| format!("  {}", dir.join(p).display())).collect();
        return Err(Error::Refused(format!(
            "refusing to overwrite {} file{} that {} edited by hand (the @generated header's hash no longer matches, or for workload.toml the hash in {LOCK_FILE}):\n{}\nMove the change into the workload, the registry or the templates and rebuild (`monogen build --crate DIR` builds from the crate's own workload.toml), or pass --force to discard it",
            edited.len(),
            if edited.len() == 1 { "" } else { "s" },
            if edited.len() == 1 { "was" } else { "were" },
            list.join("\n")
        )));
    }
    if !report.changed() {
        return Ok(report);
    }
    commit(dir, &writes, &report.removed)?;
    Ok(report)
}

/// Writes one file (a ranking, a workload, a model file) whole or not at all: into a
/// temporary file beside it, then renamed over it. Leaves an unchanged file alone; returns
/// whether it wrote.
pub fn write_file(path: &Path, contents: &[u8]) -> Result<bool, Error> {
    if fs::read(path).is_ok_and(|old| old == contents) {
        return Ok(false);
    }
    write_file_with(path, |w| w.write_all(contents))?;
    Ok(true)
}

/// [`write_file`] for a file written piece by piece (a large model file): `fill` writes the
/// contents, which replace `path` only if it succeeds.
pub fn write_file_with(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<fs::File>) -> std::io::Result<()>,
) -> Result<(), Error> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".{}.monogen-tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let file = fs::File::create(&tmp)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        fill(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Makes the folder `dir` hold exactly `files` (relative path → contents) below `prune`
/// (a subfolder of `dir`), writing only the files that changed: for scratch crates that cargo
/// rebuilds incrementally, such as the benchmark harness.
pub fn sync_folder(dir: &Path, files: &BTreeMap<PathBuf, String>, prune: &Path) -> Result<(), Error> {
    let below = dir.join(prune);
    if below.exists() {
        let mut stack = vec![below];
        while let Some(d) = stack.pop() {
            for entry in fs::read_dir(&d).map_err(|e| Error::io(&d, e))?.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if !files.contains_key(path.strip_prefix(dir).unwrap_or(&path)) {
                    fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                }
            }
        }
    }
    for (rel, text) in files {
        write_file(&dir.join(rel), text.as_bytes())?;
    }
    Ok(())
}

fn dir_has_entries(dir: &Path) -> Result<bool, Error> {
    match fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io(dir, e)),
    }
}

/// A test hook: `MONOGEN_FAULT=staged:N` aborts after N staged files, `applied:N` after N
/// renames past the commit point. It simulates a crash or a kill at that moment.
fn fault(stage: &str, count: usize) {
    if let Ok(spec) = std::env::var("MONOGEN_FAULT")
        && spec.split_once(':').is_some_and(|(s, n)| s == stage && n.parse() == Ok(count))
    {
        eprintln!("monogen: MONOGEN_FAULT={spec}: aborting");
        std::process::abort();
    }
}

fn commit(dir: &Path, writes: &BTreeMap<&Path, &str>, removals: &[PathBuf]) -> Result<(), Error> {
    let staging = dir.join(STAGING_DIR);
    fs::create_dir(&staging).map_err(|e| Error::io(&staging, e))?;
    let mut journal = String::new();
    for (i, (path, contents)) in writes.iter().enumerate() {
        let staged = staging.join("files").join(path);
        if let Some(parent) = staged.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        write_synced(&staged, contents.as_bytes())?;
        journal.push_str(&format!("write {}\n", path_line(path)));
        fault("staged", i + 1);
    }
    for path in removals {
        journal.push_str(&format!("remove {}\n", path_line(path)));
    }
    let journal_tmp = staging.join("journal.tmp");
    write_synced(&journal_tmp, journal.as_bytes())?;
    fs::rename(&journal_tmp, staging.join(JOURNAL)).map_err(|e| Error::io(&journal_tmp, e))?;
    sync_dir(&staging);
    apply(dir)
}

fn path_line(path: &Path) -> String {
    path.to_string_lossy().replace('\\', "/")
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let mut file = fs::File::create(path).map_err(|e| Error::io(path, e))?;
    file.write_all(bytes).map_err(|e| Error::io(path, e))?;
    file.sync_all().map_err(|e| Error::io(path, e))
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Carries out a committed journal (idempotently), then deletes the staging directory.
fn apply(dir: &Path) -> Result<(), Error> {
    let staging = dir.join(STAGING_DIR);
    let journal_path = staging.join(JOURNAL);
    let journal = fs::read_to_string(&journal_path).map_err(|e| Error::io(&journal_path, e))?;
    let mut applied = 0;
    for line in journal.lines() {
        let Some((op, path)) = line.split_once(' ') else { continue };
        let target = dir.join(path);
        match op {
            "write" => {
                let staged = staging.join("files").join(path);
                if !staged.exists() {
                    continue;
                }
                if let Some(parent) = target.parent() {
                    fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
                }
                fs::rename(&staged, &target).map_err(|e| Error::io(&target, e))?;
                applied += 1;
                fault("applied", applied);
            }
            "remove" => {
                match fs::remove_file(&target) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(&target, e)),
                }
                remove_empty_parents(dir, &target);
            }
            _ => {}
        }
    }
    sync_dir(dir);
    fs::remove_dir_all(&staging).map_err(|e| Error::io(&staging, e))
}

fn remove_empty_parents(dir: &Path, file: &Path) {
    let mut current = file.parent();
    while let Some(parent) = current {
        if parent == dir || !parent.starts_with(dir) || fs::remove_dir(parent).is_err() {
            break;
        }
        current = parent.parent();
    }
}

/// Finishes or discards a build that was interrupted in `dir`. Returns whether there was one.
pub fn recover(dir: &Path) -> Result<bool, Error> {
    let staging = dir.join(STAGING_DIR);
    if !staging.exists() {
        return Ok(false);
    }
    if staging.join(JOURNAL).exists() {
        apply(dir)?;
    } else {
        fs::remove_dir_all(&staging).map_err(|e| Error::io(&staging, e))?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emit::with_header;

    fn output(files: &[(&str, &str)]) -> Output {
        let mut out = Output::default();
        let mut listed = String::new();
        for (path, body) in files {
            out.files.insert(PathBuf::from(path), with_header(Path::new(path), body, "w"));
            listed.push_str(&format!("[[file]]\npath = \"{path}\"\nsha256 = \"\"\n"));
        }
        out.files.insert(PathBuf::from(LOCK_FILE), with_header(Path::new(LOCK_FILE), &listed, "w"));
        out
    }

    #[test]
    fn writes_only_changes_and_removes_stale_files() {
        let dir = tempfile::tempdir().unwrap();
        let out_dir = dir.path().join("crate");
        let first = output(&[("src/a.rs", "fn a() {}"), ("src/old/b.rs", "fn b() {}")]);
        let r = write(&out_dir, &first, false).unwrap();
        assert_eq!(r.created.len(), 3);
        fs::write(out_dir.join("Cargo.lock"), "lock").unwrap();
        fs::create_dir(out_dir.join("target")).unwrap();

        let second = output(&[("src/a.rs", "fn a() {}"), ("src/c.rs", "fn c() {}")]);
        let r = write(&out_dir, &second, false).unwrap();
        assert_eq!(r.created, [PathBuf::from("src/c.rs")]);
        assert_eq!(r.updated, [PathBuf::from(LOCK_FILE)]);
        assert_eq!(r.removed, [PathBuf::from("src/old/b.rs")]);
        assert_eq!(r.unchanged, 1);
        assert!(!out_dir.join("src/old").exists(), "empty folders of stale files go too");
        assert_eq!(fs::read_to_string(out_dir.join("Cargo.lock")).unwrap(), "lock");
        assert!(out_dir.join("target").is_dir());
        assert!(!out_dir.join(STAGING_DIR).exists());
        assert!(diff(&out_dir, &second).unwrap().is_clean());
        assert!(!write(&out_dir, &second, false).unwrap().changed());
    }

    #[test]
    fn hand_edits_are_refused_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let first = output(&[("src/a.rs", "fn a() {}")]);
        write(dir.path(), &first, false).unwrap();
        let a = dir.path().join("src/a.rs");
        let edited = fs::read_to_string(&a).unwrap().replace("fn a", "fn mine");
        fs::write(&a, &edited).unwrap();

        let second = output(&[("src/a.rs", "fn a2() {}")]);
        let e = write(dir.path(), &second, false).unwrap_err().to_string();
        assert!(e.contains("refusing to overwrite 1 file that was edited by hand"), "{e}");
        assert_eq!(fs::read_to_string(&a).unwrap(), edited);
        assert_eq!(diff(dir.path(), &second).unwrap().hand_edited, [PathBuf::from("src/a.rs")]);

        write(dir.path(), &second, true).unwrap();
        assert!(fs::read_to_string(&a).unwrap().contains("fn a2"));
    }

    #[test]
    fn another_workloads_crate_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let with_name = |name: &str| {
            let mut out = Output::default();
            let lock =
                format!("[[file]]\npath = \"src/a.rs\"\nsha256 = \"\"\n\n[workload]\nname = \"{name}\"\n");
            out.files.insert(PathBuf::from("src/a.rs"), with_header(Path::new("src/a.rs"), name, name));
            out.files.insert(PathBuf::from(LOCK_FILE), with_header(Path::new(LOCK_FILE), &lock, name));
            out
        };
        write(dir.path(), &with_name("a"), false).unwrap();
        let e = write(dir.path(), &with_name("b"), false).unwrap_err().to_string();
        assert!(e.contains("holds the crate of workload `a`, not `b`"), "{e}");
        write(dir.path(), &with_name("b"), true).unwrap();
    }

    #[test]
    fn foreign_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        let e = write(dir.path(), &output(&[("src/a.rs", "")]), false).unwrap_err().to_string();
        assert!(e.contains("not a crate monogen generated"), "{e}");
        write(dir.path(), &output(&[("src/a.rs", "")]), true).unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("notes.txt")).unwrap(), "mine");
    }

    #[test]
    fn a_directory_being_written_is_refused_to_a_second_writer() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::acquire(dir.path()).unwrap();
        let e = write(dir.path(), &output(&[("src/a.rs", "")]), false).unwrap_err().to_string();
        assert!(e.contains("another monogen process is writing"), "{e}");
        drop(held);
        write(dir.path(), &output(&[("src/a.rs", "")]), false).unwrap();
    }

    #[test]
    fn uncommitted_staging_is_discarded_and_committed_staging_completed() {
        let dir = tempfile::tempdir().unwrap();
        let first = output(&[("src/a.rs", "fn a() {}")]);
        write(dir.path(), &first, false).unwrap();

        // Interrupted before the commit point: only staged files, no journal.
        let staging = dir.path().join(STAGING_DIR);
        fs::create_dir_all(staging.join("files/src")).unwrap();
        fs::write(staging.join("files/src/a.rs"), "half").unwrap();
        assert!(recover(dir.path()).unwrap());
        assert!(!staging.exists());
        assert_eq!(
            fs::read_to_string(dir.path().join("src/a.rs")).unwrap(),
            first.files[Path::new("src/a.rs")]
        );

        // Interrupted after it: the journal is carried out.
        fs::create_dir_all(staging.join("files/src")).unwrap();
        fs::write(staging.join("files/src/a.rs"), "new").unwrap();
        fs::write(staging.join(JOURNAL), "write src/a.rs\n").unwrap();
        assert!(recover(dir.path()).unwrap());
        assert_eq!(fs::read_to_string(dir.path().join("src/a.rs")).unwrap(), "new");
        assert!(!staging.exists());
    }
}
