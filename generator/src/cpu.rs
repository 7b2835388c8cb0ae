//! What monogen knows about CPU features: the names a workload may list, the
//! x86-64 microarchitecture levels, and (for `monogen init` and `monogen bench`) this host's
//! features.
//!
//! Feature names are Rust `target_feature` names, so that a kernel's
//! `#[target_feature(enable = "...")]` and the generated start-up check use the same words.

/// Every x86-64 feature a workload may list, in a fixed order (the order `init` writes them).
pub const X86_64_FEATURES: &[&str] = &[
    "sse3",
    "ssse3",
    "sse4.1",
    "sse4.2",
    "popcnt",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi1",
    "bmi2",
    "lzcnt",
    "movbe",
    "avx512f",
    "avx512cd",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512ifma",
    "avx512vbmi",
    "avx512vbmi2",
    "avx512vnni",
    "avx512bitalg",
    "avx512vpopcntdq",
    "avx512bf16",
    "avx512fp16",
    "avxvnni",
    "avxifma",
    "avxvnniint8",
    "amx-tile",
    "amx-bf16",
    "amx-int8",
];

/// The CPUID leaf 7 EDX bit of an AMX feature, whose detection macro is unstable; `None` for
/// any other feature.
pub fn amx_bit(feature: &str) -> Option<u32> {
    match feature {
        "amx-bf16" => Some(22),
        "amx-tile" => Some(24),
        "amx-int8" => Some(25),
        _ => None,
    }
}

/// The x86-64 psABI microarchitecture levels, as shorthands for `--cpu-features`.
pub fn x86_64_level(name: &str) -> Option<Vec<&'static str>> {
    const V2: &[&str] = &["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"];
    const V3: &[&str] = &["avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe"];
    const V4: &[&str] = &["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"];
    let levels: &[&[&str]] = match name {
        "x86-64" => &[],
        "x86-64-v2" => &[V2],
        "x86-64-v3" => &[V2, V3],
        "x86-64-v4" => &[V2, V3, V4],
        _ => return None,
    };
    Some(levels.iter().flat_map(|l| l.iter().copied()).collect())
}

/// The names of the levels [`x86_64_level`] accepts.
pub const X86_64_LEVELS: &[&str] = &["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"];

/// The features of the CPU monogen runs on, in [`X86_64_FEATURES`] order.
///
/// Only `monogen init` calls this: `build`, `explain` and `check` depend on the repository's
/// contents alone, never on the host.
pub fn host_features() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        X86_64_FEATURES.iter().copied().filter(|f| host_has(f)).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// The architecture name (`target_arch`) of the host.
pub fn host_arch() -> &'static str {
    std::env::consts::ARCH
}

#[cfg(target_arch = "x86_64")]
fn host_has(feature: &str) -> bool {
    use std::arch::is_x86_feature_detected as has;
    match feature {
        "sse3" => has!("sse3"),
        "ssse3" => has!("ssse3"),
        "sse4.1" => has!("sse4.1"),
        "sse4.2" => has!("sse4.2"),
        "popcnt" => has!("popcnt"),
        "avx" => has!("avx"),
        "avx2" => has!("avx2"),
        "fma" => has!("fma"),
        "f16c" => has!("f16c"),
        "bmi1" => has!("bmi1"),
        "bmi2" => has!("bmi2"),
        "lzcnt" => has!("lzcnt"),
        "movbe" => has!("movbe"),
        "avx512f" => has!("avx512f"),
        "avx512cd" => has!("avx512cd"),
        "avx512bw" => has!("avx512bw"),
        "avx512dq" => has!("avx512dq"),
        "avx512vl" => has!("avx512vl"),
        "avx512ifma" => has!("avx512ifma"),
        "avx512vbmi" => has!("avx512vbmi"),
        "avx512vbmi2" => has!("avx512vbmi2"),
        "avx512vnni" => has!("avx512vnni"),
        "avx512bitalg" => has!("avx512bitalg"),
        "avx512vpopcntdq" => has!("avx512vpopcntdq"),
        "avx512bf16" => has!("avx512bf16"),
        "avx512fp16" => has!("avx512fp16"),
        "avxvnni" => has!("avxvnni"),
        "avxifma" => has!("avxifma"),
        "avxvnniint8" => has!("avxvnniint8"),
        // The AMX detection macros are unstable; read CPUID leaf 7 directly.
        amx => amx_bit(amx).is_some_and(|bit| cpuid7_edx() & (1 << bit) != 0),
    }
}

#[cfg(target_arch = "x86_64")]
fn cpuid7_edx() -> u32 {
    // CPUID leaf 7 exists on every x86-64 CPU that has any of the features asked about.
    let max_leaf = std::arch::x86_64::__cpuid(0).eax;
    if max_leaf < 7 {
        return 0;
    }
    std::arch::x86_64::__cpuid_count(7, 0).edx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_only_name_known_features() {
        for level in X86_64_LEVELS {
            for f in x86_64_level(level).unwrap() {
                assert!(X86_64_FEATURES.contains(&f), "{f}");
            }
        }
        assert!(x86_64_level("x86-64-v5").is_none());
    }

    #[test]
    fn host_features_are_known_and_ordered() {
        let host = host_features();
        let positions: Vec<usize> =
            host.iter().map(|f| X86_64_FEATURES.iter().position(|k| k == f).unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]));
    }
}
