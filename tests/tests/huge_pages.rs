//! `templates/runtime/huge_pages.rs`, which a crate with resident weights reads to decide
//! whether to copy them (`templates/runtime/resident.rs`): the share of a mapping in huge pages,
//! from smaps text and from this process's own `/proc/self/smaps`.

#[path = "../../templates/runtime/huge_pages.rs"]
mod huge_pages;

/// Two mappings of a file, one at 0x7f0000000000 (8 MiB, 6 of them in huge pages) and one at
/// 0x7f0000800000 (4 MiB, none), then an anonymous one (2 MiB, all of it).
const SMAPS: &str = "\
7f0000000000-7f0000800000 r--s 00000000 fe:00 5357572                    /models/a/model.safetensors
Size:               8192 kB
KernelPageSize:        4 kB
Rss:                8192 kB
AnonHugePages:         0 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:      6144 kB
VmFlags: rd mr me ms hg
7f0000800000-7f0000c00000 r--s 00800000 fe:00 5357572                    /models/a/model.safetensors
Size:               4096 kB
Rss:                4096 kB
AnonHugePages:         0 kB
FilePmdMapped:         0 kB
VmFlags: rd mr me ms
7f0000c00000-7f0000e00000 rw-p 00000000 00:00 0
Size:               2048 kB
AnonHugePages:      2048 kB
FilePmdMapped:         0 kB
THPeligible:           1
";

#[test]
fn share_of_the_mappings_inside_a_range() {
    let base = 0x7f00_0000_0000usize;
    let mib = 1 << 20;
    // The first mapping alone, as its bytes (a length that ends inside its last page).
    assert_eq!(huge_pages::share_in(SMAPS, base..base + 8 * mib - 100), Some(0.75));
    // Both file mappings: 6 of 12 MiB.
    assert_eq!(huge_pages::share_in(SMAPS, base..base + 12 * mib), Some(0.5));
    // All three: 8 of 14 MiB.
    assert_eq!(huge_pages::share_in(SMAPS, base..base + 14 * mib), Some(8.0 / 14.0));
    // The anonymous mapping, from a start inside its first page.
    assert_eq!(huge_pages::share_in(SMAPS, base + 12 * mib + 16..base + 14 * mib), Some(1.0));
    // A range that holds no whole mapping.
    assert_eq!(huge_pages::share_in(SMAPS, base + mib..base + 2 * mib), None);
    assert_eq!(huge_pages::share_in("", base..base + mib), None);
}

#[cfg(target_os = "linux")]
#[test]
fn share_of_a_mapping_of_this_process() {
    // 16 MiB is its own anonymous mapping (far above malloc's mmap threshold), from the
    // allocator's header just before the vector to the end of its last page.
    let bytes = vec![1u8; 16 << 20];
    let share = huge_pages::share(&bytes).expect("the vector's mapping is in /proc/self/smaps");
    assert!((0.0..=1.0).contains(&share), "{share}");
    // Its heap neighbours' bytes are no whole mapping.
    let small = vec![1u8; 100];
    assert_eq!(huge_pages::share(&small), None);
}
