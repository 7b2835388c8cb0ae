//! The committed crates under generated/ are exactly what `monogen build` writes for the
//! workloads under workloads/ today, and generating twice gives identical bytes.

use std::path::PathBuf;

use monogen::Project;
use monogen_tests::workspace_root;

fn project() -> Project {
    Project::load(&workspace_root()).unwrap_or_else(|e| panic!("{}", e.render(false)))
}

#[test]
fn committed_crates_are_fresh() {
    let project = project();
    let workloads = project.workloads().unwrap();
    assert!(workloads.len() >= 2, "workloads/ should hold the example workloads");
    let mut stale = Vec::new();
    let mut names = Vec::new();
    for path in &workloads {
        let (plan, output) = project.generate(path).unwrap_or_else(|e| panic!("{}", e.render(false)));
        let dir = project.default_out_dir(&plan.name);
        names.push(plan.name.clone());
        let diff = monogen::write::diff(&dir, &output).unwrap();
        if !diff.is_clean() {
            let relative = path.strip_prefix(&project.root).unwrap_or(path);
            stale.push(format!(
                "{}: missing {:?}, differs {:?}, stale {:?}\n  refresh with: cargo run -p monogen -- build {}",
                dir.display(),
                diff.missing,
                diff.modified,
                diff.stale,
                relative.display()
            ));
        }
    }
    let orphans: Vec<PathBuf> = std::fs::read_dir(project.root.join("generated"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !names.iter().any(|n| p.ends_with(n)))
        .collect();
    assert!(orphans.is_empty(), "generated/ holds crates without a workload: {orphans:?}");
    assert!(stale.is_empty(), "generated crates are out of date:\n{}", stale.join("\n"));
}

#[test]
fn generation_is_deterministic() {
    let project = project();
    for path in project.workloads().unwrap() {
        let (_, first) = project.generate(&path).unwrap();
        let again = Project::load(&project.root).unwrap();
        let (_, second) = again.generate(&path).unwrap();
        assert_eq!(first, second, "{} generates differently on a second run", path.display());
        for (file, contents) in &first.files {
            assert!(!contents.contains('\r'), "{} has CR line endings", file.display());
            if file == std::path::Path::new(monogen::emit::WORKLOAD_FILE) {
                // The crate's input, copied as written: `build --crate` reads it back.
                assert_eq!(*contents, std::fs::read_to_string(&path).unwrap(), "{}", path.display());
                continue;
            }
            assert!(contents.contains("@generated"), "{} lacks the @generated header", file.display());
        }
    }
}
