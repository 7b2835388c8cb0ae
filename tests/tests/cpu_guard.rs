//! A crate whose kernels need a CPU feature this machine lacks starts, names the missing
//! feature and exits with code 4, instead of dying on an illegal instruction.
//!
//! The test generates such a crate from a scratch copy of the registry with one more matmul
//! implementation: the scalar kernel, declared to need a feature this CPU does not have
//! (AMX-TILE, AVX-IFMA or AVX-VNNI-INT8), and preferred by priority.

use std::process::Command;

use monogen_tests::{build_crate, copy_dir, model_dir, workspace_root};

/// A feature monogen knows that this CPU lacks, if there is one: AMX-TILE first, whose start-up
/// check (CPUID, then asking Linux for the tiles' state) differs from the others'.
fn missing_feature() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        if __cpuid(0).eax < 7 || __cpuid_count(7, 0).edx & (1 << 24) == 0 {
            return Some("amx-tile");
        }
        if !std::arch::is_x86_feature_detected!("avxifma") {
            return Some("avxifma");
        }
        if !std::arch::is_x86_feature_detected!("avxvnniint8") {
            return Some("avxvnniint8");
        }
    }
    None
}

#[test]
fn a_crate_for_a_missing_cpu_feature_says_which_and_exits_4() {
    let Some(model) = model_dir("stories260k") else { return };
    let Some(feature) = missing_feature() else {
        monogen_tests::skip::because(
            "a_crate_for_a_missing_cpu_feature_says_which_and_exits_4",
            "this CPU has every feature the test could make a crate require",
        );
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path();
    for dir in ["interfaces", "implementations", "templates"] {
        copy_dir(&workspace_root().join(dir), &root.join(dir));
    }
    let imp = root.join("implementations/matmul/needs-feature");
    copy_dir(&root.join("implementations/matmul/scalar"), &imp);
    let manifest = std::fs::read_to_string(imp.join("manifest.toml"))
        .unwrap()
        .replace("name = \"scalar\"", "name = \"needs-feature\"")
        .replace("priority = 0", "priority = 1000")
        .replace("cpu_features = []", &format!("arches = [\"x86_64\"]\ncpu_features = [\"{feature}\"]"));
    std::fs::write(imp.join("manifest.toml"), manifest).unwrap();

    let name = "stories260k-needs-feature";
    let workload = std::fs::read_to_string(workspace_root().join("workloads/stories260k-cpu-f32.toml"))
        .unwrap()
        .replace("name = \"stories260k-cpu-f32\"", &format!("name = \"{name}\""))
        .replace("cpu_features = [\"sse3\",", &format!("cpu_features = [\"{feature}\", \"sse3\","))
        .lines()
        .filter(|l| !l.starts_with("hardware = "))
        .collect::<Vec<_>>()
        .join("\n");
    let path = root.join("workload.toml");
    std::fs::write(&path, workload).unwrap();

    let project = monogen::Project::load(root).unwrap();
    let out = root.join(name);
    let (plan, output) = project.generate_into(&path, Some(&out)).unwrap();
    assert_eq!(plan.interface("matmul").expect("the plan calls matmul").chosen.name, "needs-feature");
    assert!(plan.cpu_features.iter().any(|f| f == feature), "{:?}", plan.cpu_features);
    monogen::write::write(&out, &output, false).unwrap();

    let binary = build_crate(&out, name);
    let run = Command::new(&binary)
        .args(["--model", model.to_str().unwrap(), "--prompt", "Once upon a time", "--max-tokens", "4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains(&format!("this CPU lacks {feature}")), "{stderr}");
    assert!(run.stdout.is_empty(), "nothing runs before the check");
}
