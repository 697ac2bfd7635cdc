//! Tests of what holds for both paging modes, x86_64's 4-level tables
//! ([`crate::paging`]) and x86_32's PAE tables ([`crate::pae`]): written once
//! over the two builders' functions. (The builders have no trait over them:
//! the kernel's flavour code calls its own builder, and the only code written
//! for both is this test.)

use crate::layout::{DirectMap, USER_STACK_TOP, USER_TEXT_BASE};
use crate::pte::{FrameSource, PhysMem, Translation, UserSpec};
use std::collections::BTreeMap;

#[derive(Default)]
struct FakeMem(BTreeMap<(u64, usize), u64>);
impl PhysMem for FakeMem {
    fn read(&self, table: u64, index: usize) -> u64 {
        *self.0.get(&(table, index)).unwrap_or(&0)
    }
    fn write(&mut self, table: u64, index: usize, value: u64) {
        self.0.insert((table, index), value);
    }
}

struct Bump(u64);
impl FrameSource for Bump {
    fn frame(&mut self) -> Option<u64> {
        self.0 += 4096;
        Some(self.0 - 4096)
    }
    fn pair(&mut self) -> Option<u64> {
        self.0 = (self.0 + 8191) & !8191;
        let p = self.frame()?;
        self.frame()?;
        Some(p)
    }
}

const ENTRY: (u64, u64) = (0x10_2000, 0x10_5000);
const ENTRY_TEXT_END: u64 = 0x10_3000;
const KDATA: u64 = 0x11_8000;
const TELEMETRY: u64 = 0x7ff_f000;

fn user() -> UserSpec {
    UserSpec {
        text_phys: 0x12_0000,
        text_pages: 2,
        stack: [0x13_0000, 0x13_1000],
    }
}

/// One mode's functions, as the check below needs them.
struct Mode<H> {
    name: &'static str,
    direct_map: DirectMap,
    cr3_value: fn(u64, bool, u64, bool) -> u64,
    translate: fn(&FakeMem, u64, u64) -> Option<Translation>,
    opt_out: fn(&mut FakeMem, u64, &H),
    opt_in: fn(&mut FakeMem, u64, &H),
}

/// With PTI the user copy of `pair` maps the user half and the entry
/// area but no other kernel data; the kernel copy maps both; opting out
/// of PTI makes the copies alike, opting back in restores the isolation.
fn isolation_holds<H>(m: &Mode<H>, mem: &mut FakeMem, pair: u64, half: &H) {
    let (name, tr) = (m.name, m.translate);
    let kernel_root = (m.cr3_value)(pair, false, 0, false) & !0xfff;
    let user_root = (m.cr3_value)(pair, true, 0, false) & !0xfff;
    let kdata = m.direct_map.phys_to_virt(KDATA).unwrap();
    let entry = m.direct_map.phys_to_virt(ENTRY.0).unwrap();
    let stack = USER_STACK_TOP - 4096;
    for root in [kernel_root, user_root] {
        assert!(tr(mem, root, USER_TEXT_BASE).is_some(), "{name}");
        assert!(tr(mem, root, stack).is_some(), "{name}");
        assert!(tr(mem, root, entry).is_some(), "{name}");
    }
    assert!(tr(mem, kernel_root, kdata).is_some(), "{name}");
    assert!(tr(mem, user_root, kdata).is_none(), "{name}");
    (m.opt_out)(mem, pair, half);
    assert!(tr(mem, user_root, kdata).is_some(), "{name}");
    (m.opt_in)(mem, pair, half);
    assert!(tr(mem, user_root, kdata).is_none(), "{name}");
}

#[test]
fn both_modes_isolate_alike() {
    let (mut mem, mut frames) = (FakeMem::default(), Bump(0x20_0000));
    let half = crate::paging::build_kernel_half(
        &mut mem,
        &mut frames,
        &crate::paging::KernelSpec {
            pti: true,
            entry_area: ENTRY,
            entry_text_end: ENTRY_TEXT_END,
            telemetry: TELEMETRY,
            direct_map: 64 << 20,
            deferred_text: (0, 0),
        },
    )
    .unwrap();
    let pair = crate::paging::build_address_space(&mut mem, &mut frames, &half, &user()).unwrap();
    let four_level = Mode {
        name: "4-level",
        direct_map: crate::layout::DIRECT_MAP,
        cr3_value: crate::layout::cr3_value,
        translate: crate::paging::translate::<FakeMem>,
        opt_out: crate::paging::opt_out_of_pti::<FakeMem>,
        opt_in: crate::paging::opt_in_to_pti::<FakeMem>,
    };
    isolation_holds(&four_level, &mut mem, pair, &half);

    let (mut mem, mut frames) = (FakeMem::default(), Bump(0x20_0000));
    let half = crate::pae::build_kernel_half(
        &mut mem,
        &mut frames,
        &crate::pae::KernelSpec {
            pti: true,
            entry_area: ENTRY,
            entry_text_end: ENTRY_TEXT_END,
            text: (0x10_5000, 0x11_0000),
            global_text: false,
            nx: true,
            telemetry: TELEMETRY,
            direct_map: 64 << 20,
            deferred_text: (0, 0),
        },
    )
    .unwrap();
    let pair =
        crate::pae::build_address_space(&mut mem, &mut frames, &half, &user(), true).unwrap();
    let pae = Mode {
        name: "PAE",
        direct_map: crate::pae::layout::DIRECT_MAP,
        cr3_value: crate::pae::layout::cr3_value,
        translate: crate::pae::translate::<FakeMem>,
        opt_out: crate::pae::opt_out_of_pti::<FakeMem>,
        opt_in: crate::pae::opt_in_to_pti::<FakeMem>,
    };
    isolation_holds(&pae, &mut mem, pair, &half);
}
