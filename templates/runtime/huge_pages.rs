//! How much of a mapping the kernel maps in huge pages: the share of its bytes behind 2 MiB
//! page-table entries (a page-cache folio of a file, or a transparent huge page of anonymous
//! memory), as `/proc/self/smaps` reports it per mapping.

use std::ops::Range;

/// The share (0 to 1) of `bytes` that this process maps in huge pages; `None` where
/// `/proc/self/smaps` cannot be read or does not cover `bytes`.
pub fn share(bytes: &[u8]) -> Option<f64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let start = bytes.as_ptr() as usize;
    share_in(&smaps, start..start + bytes.len())
}

/// [`share`] from the text of an smaps file: the mappings that lie inside `range` (widened to
/// whole 4 KiB pages), their `FilePmdMapped`, `AnonHugePages` and `ShmemPmdMapped` over their
/// `Size`. `None` where no mapping lies inside it.
pub fn share_in(smaps: &str, range: Range<usize>) -> Option<f64> {
    let range = range.start & !4095..range.end.next_multiple_of(4096);
    let (mut size, mut huge, mut inside) = (0u64, 0u64, false);
    for line in smaps.lines() {
        let (key, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        // A mapping's first line: `start-end perms offset dev inode [path]`, in hexadecimal.
        if let Some((from, to)) = key.split_once('-')
            && let (Ok(from), Ok(to)) = (usize::from_str_radix(from, 16), usize::from_str_radix(to, 16))
        {
            inside = range.start <= from && to <= range.end;
            continue;
        }
        if !inside {
            continue;
        }
        let kib = || rest.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0);
        match key {
            "Size:" => size += kib(),
            "FilePmdMapped:" | "AnonHugePages:" | "ShmemPmdMapped:" => huge += kib(),
            _ => {}
        }
    }
    (size > 0).then(|| huge as f64 / size as f64)
}
