//! Conformance tests and benchmarks of the kernels in `implementations/`.
//!
//! The build script compiles every implementation into [`kernels`] as
//! `kernels::<interface>__<name>`, with the helper modules of `implementations/_shared/` in
//! `kernels::shared`, laid out so that a kernel's `super::shared::...` resolves as it does in
//! a generated crate. It also writes one test per implementation, which runs the
//! conformance check of the implementation's family ([`check`], one per family: an interface,
//! or one element type of an interface with `[[elements]]`, `matmul_bf16`) against the
//! family's reference implementation, and a `for_each_<family>!` macro per family that lists
//! its implementations for the benchmark (`benches/kernels.rs`).

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
        let has = true $(&& $crate::x86_has!($feature))*;
        #[cfg(target_arch = "aarch64")]
        let has = true $(&& std::arch::is_aarch64_feature_detected!($feature))*;
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
        let has = true $(&& cfg!(target_feature = $feature))*;
        has
    }};
}

/// One x86 feature: `is_x86_feature_detected!`, except for the AMX features, whose detection
/// macro is unstable: [`amx_usable`].
#[doc(hidden)]
#[macro_export]
macro_rules! x86_has {
    ("amx-bf16") => {
        $crate::amx_usable(22)
    };
    ("amx-tile") => {
        $crate::amx_usable(24)
    };
    ("amx-int8") => {
        $crate::amx_usable(25)
    };
    ($feature:tt) => {
        std::arch::is_x86_feature_detected!($feature)
    };
}

/// Whether this CPU has the AMX feature of CPUID leaf 7's EDX bit `bit` and the kernel grants
/// this process the tiles' state (Linux's `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
/// which a process must ask before its first tile instruction), as a generated crate's start-up
/// check does.
#[cfg(target_arch = "x86_64")]
pub fn amx_usable(bit: u32) -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 7 || __cpuid_count(7, 0).edx & (1 << bit) == 0 {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
        const XFEATURE_XTILEDATA: usize = 18;
        const SYS_ARCH_PRCTL: isize = 158;
        let result: isize;
        // SAFETY: arch_prctl with these arguments only changes which register state the
        // kernel lets this process use; it reads and writes no memory of the process.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => result,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            )
        };
        result == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub fn amx_usable(_bit: u32) -> bool {
    false
}

#[cfg(test)]
mod conformance {
    include!(concat!(env!("OUT_DIR"), "/conformance.rs"));
}

#[cfg(test)]
mod properties;
