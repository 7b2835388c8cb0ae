//! The workload parser and its diagnostics on arbitrary text: it must return a workload or
//! diagnostics whose rendering (spans underlined in the source) never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monogen::workload::WorkloadSource;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(diagnostics) = WorkloadSource::from_text("fuzz.toml", text).parse() {
        for d in diagnostics {
            let _ = d.render();
            let _ = d.render_styled();
        }
    }
});
