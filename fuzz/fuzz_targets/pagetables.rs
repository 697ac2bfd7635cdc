//! The host page-table walker over arbitrary guest memory: the input is
//! the first 64 KiB of a 1 MiB guest (its tables), CR3 and the paging mode.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use ptiscope::observe::pagetables::{
    check_isolation, render, walk_with_limits, EntryArea, Paging, WalkLimits,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let paging = if data[0] & 1 == 0 {
        Paging::FourLevel
    } else {
        Paging::Pae
    };
    // CR3 mostly inside the tables, sometimes anywhere.
    let raw = u64::from_le_bytes(data[1..9].try_into().unwrap());
    let cr3 = if data[0] & 2 == 0 { raw & 0xffff } else { raw };
    let tables = &data[9..];
    // One guest for every input (mapping 1 MiB per input dominated the
    // run time): the table area is rewritten, zero-padded, each time.
    static MEM: OnceLock<GuestMemoryMmap> = OnceLock::new();
    let mem = MEM
        .get_or_init(|| GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let mut area = vec![0u8; 0x1_0000];
    let used = tables.len().min(area.len());
    area[..used].copy_from_slice(&tables[..used]);
    mem.write_slice(&area, GuestAddress(0)).unwrap();
    // Small limits keep each input fast; the bounds are what is tested.
    let limits = WalkLimits {
        max_entries_read: 1 << 12,
        max_mappings: 1 << 10,
        max_time: Duration::from_millis(200),
    };
    let started = Instant::now();
    let Ok(walk) = walk_with_limits(mem, paging, cr3, limits) else {
        return;
    };
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "walk overran its time limit"
    );
    assert!(walk.mappings.len() <= limits.max_mappings);
    for pair in walk.mappings.windows(2) {
        assert!(pair[0].virt < pair[1].virt, "mappings out of order");
    }
    let base = paging.kernel_half_start();
    let entry = EntryArea {
        ranges: vec![(".entry.text".into(), base..base + 0x10_0000)],
    };
    let check = check_isolation(&walk, paging, &entry);
    // Never ISOLATED from a walk that gave up or met a table outside RAM.
    if walk.incomplete.is_some() || !walk.unreadable_tables.is_empty() {
        assert!(!check.isolated());
    }
    let _ = render(&walk);
    let _ = check.verdict();
});
