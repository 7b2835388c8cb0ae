//! The machine `monogen bench` (and `monogen init`) runs on: its hardware class and the
//! fingerprint that goes into every measurement record.
//!
//! Nothing else reads the host: `build`, `explain`, `check` and `affected` depend on the
//! repository's contents alone.

use std::process::Command;

use serde::Serialize;

use crate::cpu;

/// What a measurement depends on besides the code and the shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Host {
    /// `<cpu model>-<cores>c`, as a folder name: the class workloads name in `target.hardware`.
    pub class: String,
    /// The CPU's model name, as the operating system reports it.
    pub cpu: String,
    /// Cores this process may run on.
    pub cores: usize,
    /// The CPU features monogen knows that this CPU has, in canonical order.
    pub cpu_features: Vec<String>,
    /// `rustc --version` of the toolchain that builds the benchmark harness.
    pub rustc: String,
}

impl Host {
    /// Reads this machine. Fails only if `rustc` cannot be run.
    pub fn detect() -> Result<Host, String> {
        let cpu = cpu_model();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let rustc = rustc_version()?;
        Ok(Host {
            class: hardware_class(&cpu, cores),
            cpu,
            cores,
            cpu_features: cpu::host_features().into_iter().map(String::from).collect(),
            rustc,
        })
    }
}

/// This machine's hardware class, without asking for the toolchain.
pub fn this_class() -> String {
    hardware_class(&cpu_model(), std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The hardware class of a CPU model with `cores` cores: the model name in lowercase words
/// joined by `-`, without trademarks, frequency or the words "cpu" and "processor" where
/// other words remain, then the core count. `Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz`
/// with 2 cores → `intel-xeon-platinum-8480-2c`.
pub fn hardware_class(cpu: &str, cores: usize) -> String {
    let model =
        cpu.split('@').next().unwrap_or(cpu).replace("(R)", " ").replace("(TM)", " ").replace("(tm)", " ");
    let words: Vec<String> = model
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    let meaningful: Vec<&String> =
        words.iter().filter(|w| !matches!(w.as_str(), "cpu" | "processor")).collect();
    let kept: Vec<&str> = if meaningful.len() >= 2 {
        meaningful.iter().map(|w| w.as_str()).collect()
    } else {
        words.iter().map(String::as_str).collect()
    };
    let mut class = kept.join("-");
    if class.is_empty() {
        class = "unknown-cpu".into();
    }
    class.truncate(56);
    format!("{}-{cores}c", class.trim_end_matches('-'))
}

fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == "model name").then(|| value.trim().to_string())
        })
        .unwrap_or_else(|| format!("unknown {} CPU", cpu::host_arch()))
}

fn rustc_version() -> Result<String, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run `{rustc} --version`: {e}"))?;
    if !out.status.success() {
        return Err(format!("`{rustc} --version` failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::hardware_class;

    #[test]
    fn classes_are_folder_names() {
        assert_eq!(
            hardware_class("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", 2),
            "intel-xeon-platinum-8480-2c"
        );
        assert_eq!(hardware_class("Intel(R) Xeon(R) Processor", 2), "intel-xeon-2c");
        assert_eq!(hardware_class("AMD EPYC 9654 96-Core Processor", 192), "amd-epyc-9654-96-core-192c");
        assert_eq!(hardware_class("", 4), "unknown-cpu-4c");
        for class in ["intel-xeon-2c", "unknown-cpu-4c"] {
            assert!(crate::workload::is_hardware_class(class));
        }
    }
}
