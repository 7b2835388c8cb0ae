//! Conformance tests and benchmarks of the kernels in `implementations/`.
//!
//! The build script compiles every implementation into [`kernels`] as
//! `kernels::<interface>__<name>`, with the helper modules of `implementations/_shared/` in
//! `kernels::shared`, laid out so that a kernel's `super::shared::...` resolves as it does in
//! a generated crate. It also writes one test per implementation, which runs the
//! conformance check of the implementation's interface ([`check`], one per interface)
//! against the interface's reference implementation, and a `for_each_<interface>!` macro per
//! interface that lists its implementations for the benchmark (`benches/kernels.rs`).

/// The thread count multi-threaded kernels read as `crate::THREADS` (a generated crate bakes
/// its workload's): 2, so that their conformance tests run them on several threads.
pub const THREADS: usize = 2;

pub mod check;
pub mod encoder;
pub mod rng;

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
include!(concat!(env!("OUT_DIR"), "/implementations.rs"));

/// Whether this CPU has every one of the given features (Rust `target_feature` names).
#[macro_export]
macro_rules! cpu_has {
    ($($feature:tt),* $(,)?) => {{
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        let has = true $(&& std::arch::is_x86_feature_detected!($feature))*;
        #[cfg(target_arch = "aarch64")]
        let has = true $(&& std::arch::is_aarch64_feature_detected!($feature))*;
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
        let has = true $(&& cfg!(target_feature = $feature))*;
        has
    }};
}

#[cfg(test)]
mod conformance {
    include!(concat!(env!("OUT_DIR"), "/conformance.rs"));
}

#[cfg(test)]
mod properties;
