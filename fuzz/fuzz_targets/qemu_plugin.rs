//! The QEMU plugin's output file, as hostile input: any bytes parse to a
//! report or an error (never a panic), a report stays within the parser's
//! bounds, and looking for the phase in it never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptiscope::observe::qemu_plugin::{PluginReport, MAX_MARKS, MAX_VCPUS};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = PluginReport::parse(data) {
        assert!(r.marks.len() <= MAX_MARKS);
        assert!(!r.totals.0.is_empty() && r.totals.0.len() <= MAX_VCPUS);
        assert!(r.marks.iter().all(|m| m.counts.0.len() == r.totals.0.len()));
        let _ = r.companion_phase();
        let _ = r.totals.total();
    }
});
