//! The AMX case that no machine shows on its own: a CPU that has the tiles, whose Linux
//! refuses them to the process. Linux hands the tiles' register state only to a process that
//! asks, `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, and may answer no (a seccomp
//! policy, a kernel built without it, a signal stack too small for the state). A crate whose
//! kernels use the tiles must then refuse to load, naming them, rather than fault on its first
//! tile instruction.
//!
//! The refusal is made real: a seccomp filter, installed on the thread that loads the model,
//! answers that one request EPERM, as such a policy would. The test checks the filter on
//! every x86-64 Linux machine (the request is refused with EPERM); the crate's answer to it
//! proves something only where the CPU has AMX, so elsewhere the test says it skipped.

#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use monogen_tests::{model_dir, skip};
use stories260k_cpu_bf16_amx as amx;

const SYS_ARCH_PRCTL: libc::c_long = 158;
const ARCH_REQ_XCOMP_PERM: u32 = 0x1023;
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// Asks for the tiles as the crate does; 0, or the errno of the refusal.
fn request_tiles() -> i32 {
    // SAFETY: this system call changes which register state the process may use; it reads
    // and writes none of its memory.
    let result =
        unsafe { libc::syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM as libc::c_ulong, XFEATURE_XTILEDATA) };
    if result == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap_or(-1) }
}

/// Installs, on the calling thread (and the threads it starts), a seccomp filter that answers
/// `arch_prctl(ARCH_REQ_XCOMP_PERM, ..)` with EPERM and lets every other system call through.
fn refuse_the_tiles() -> std::io::Result<()> {
    // Classic BPF over `struct seccomp_data`: nr at 0, arch at 4, args[0] from 16.
    // BPF_LD | BPF_W | BPF_ABS (0x00 | 0x00 | 0x20), BPF_JMP | BPF_JEQ | BPF_K (0x05 | 0x10 |
    // 0x00), BPF_RET | BPF_K (0x06 | 0x00).
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let stmt = |code, k| libc::sock_filter { code, jt: 0, jf: 0, k };
    let jump = |code, k, jt, jf| libc::sock_filter { code, jt, jf, k };
    let mut program = [
        stmt(LD_W_ABS, 4),
        jump(JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(RET_K, RET_ALLOW),
        stmt(LD_W_ABS, 0),
        jump(JEQ_K, SYS_ARCH_PRCTL as u32, 0, 3),
        stmt(LD_W_ABS, 16),
        jump(JEQ_K, ARCH_REQ_XCOMP_PERM, 0, 1),
        stmt(RET_K, RET_ERRNO | libc::EPERM as u32),
        stmt(RET_K, RET_ALLOW),
    ];
    let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_mut_ptr() };
    // SAFETY: PR_SET_NO_NEW_PRIVS only forbids privilege gains by exec; seccomp reads the
    // program, which outlives the call (the kernel copies it).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
        if libc::syscall(libc::SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0 as libc::c_ulong, &fprog as *const _)
            != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether CPUID lists AMX-TILE and AMX-BF16 (leaf 7, EDX bits 24 and 22).
fn cpu_has_amx() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    __cpuid(0).eax >= 7 && {
        let edx = __cpuid_count(7, 0).edx;
        edx & (1 << 24) != 0 && edx & (1 << 22) != 0
    }
}

#[test]
fn a_crate_on_amx_tiles_refuses_to_load_where_linux_refuses_the_tiles() {
    let Some(dir) = model_dir("stories260k") else { return };
    let refused = std::thread::spawn(move || {
        if let Err(e) = refuse_the_tiles() {
            return Err(format!("this kernel does not let a process install a seccomp filter ({e})"));
        }
        Ok((request_tiles(), amx::Model::load(&dir).err().map(|e| e.to_string())))
    })
    .join()
    .expect("the filtered thread ran to its end");
    let (errno, load) = match refused {
        Ok(outcome) => outcome,
        Err(reason) => return skip::because(&monogen_tests::current_test(), &reason),
    };
    assert_eq!(errno, libc::EPERM, "the filter does not refuse the tiles: the request got errno {errno}");
    let load = load.expect("the crate loaded, and would run its tile instructions, with the tiles refused");
    assert!(
        load.contains("amx-tile") && load.contains("amx-bf16") && load.contains(amx::WORKLOAD),
        "the refusal does not name the tiles: {load}"
    );
    if !cpu_has_amx() {
        // Without AMX, CPUID already answered no: the refusal's path did not run.
        skip::cpu(&monogen_tests::current_test(), &["amx-tile", "amx-bf16"]);
    }
}
