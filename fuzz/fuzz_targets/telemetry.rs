//! The telemetry-page reader: the guest writes the whole page, the host
//! reads it at every phase marker and in the metrics thread.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptiscope::observe::telemetry::{delta, TelemetryReader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const PAGE: u64 = 0x1000;

fuzz_target!(|data: &[u8]| {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x4000)]).unwrap();
    // Two versions of the page: the first half of the input, then the
    // second, for the delta between snapshots.
    let (a, b) = data.split_at(data.len() / 2);
    let mut snapshots = Vec::new();
    for page in [a, b] {
        let bytes = &page[..page.len().min(0x2000)];
        mem.write_slice(bytes, GuestAddress(PAGE)).unwrap();
        let Ok(reader) = TelemetryReader::new(&mem, GuestAddress(PAGE)) else {
            return;
        };
        if let Ok(s) = reader.snapshot() {
            let _ = s.cr3_writes();
            let _ = s.totals();
            let _ = s.named_totals().count();
            for cpu in 0..s.cpu_count() + 1 {
                let _ = s.get(cpu, ptiscope_abi::telemetry::Counter::ALL[0]);
            }
            snapshots.push(s);
        }
    }
    if let [before, after] = &snapshots[..] {
        let _ = delta(before, after);
    }
    // A region that straddles the end of RAM or is misaligned is refused.
    assert!(TelemetryReader::new(&mem, GuestAddress(0x3ff8)).is_err());
});
