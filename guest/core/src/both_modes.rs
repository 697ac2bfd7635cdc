//! Tests of what holds for both paging modes, x86_64's 4-level tables
//! ([`crate::paging::FourLevel`]) and x86_32's PAE tables
//! ([`crate::pae::Pae`]): written once, as the builders are
//! ([`crate::pti`], generic over [`PagingMode`]).

use crate::layout::{DirectMap, USER_STACK_TOP, USER_TEXT_BASE};
use crate::pte::{FrameSource, PhysMem, Translation, UserSpec};
use crate::pti::{KernelSpec, PagingMode};
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

/// What the check needs of a mode besides [`PagingMode`]: its layout and
/// its walk.
struct Mode {
    name: &'static str,
    direct_map: DirectMap,
    cr3_value: fn(u64, bool, u64, bool) -> u64,
    translate: fn(&FakeMem, u64, u64) -> Option<Translation>,
}

/// Builds a kernel half and a process with PTI in mode `P` (one spec for
/// both modes), then checks that the user copy maps the user half and the
/// entry area but no other kernel data, the kernel copy both; that opting
/// out of PTI makes the copies alike and opting back in restores the
/// isolation.
fn isolation_holds<P: PagingMode>(m: &Mode) {
    let (mut mem, mut frames) = (FakeMem::default(), Bump(0x20_0000));
    let spec = KernelSpec {
        pti: true,
        entry_area: ENTRY,
        entry_text_end: ENTRY_TEXT_END,
        text: (0x10_5000, 0x11_0000),
        global_text: false,
        nx: true,
        telemetry: TELEMETRY,
        direct_map: 64 << 20,
        deferred_text: (0, 0),
    };
    let half = crate::pti::build_kernel_half::<P, _, _>(&mut mem, &mut frames, &spec).unwrap();
    let pair =
        crate::pti::build_address_space::<P, _, _>(&mut mem, &mut frames, &half, &user(), true)
            .unwrap();
    let mem = &mut mem;
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
    P::opt_out_of_pti(mem, pair, &half);
    assert!(tr(mem, user_root, kdata).is_some(), "{name}");
    P::opt_in_to_pti(mem, pair, &half);
    assert!(tr(mem, user_root, kdata).is_none(), "{name}");
}

#[test]
fn both_modes_isolate_alike() {
    isolation_holds::<crate::paging::FourLevel>(&Mode {
        name: "4-level",
        direct_map: crate::layout::DIRECT_MAP,
        cr3_value: crate::layout::cr3_value,
        translate: crate::paging::translate::<FakeMem>,
    });
    isolation_holds::<crate::pae::Pae>(&Mode {
        name: "PAE",
        direct_map: crate::pae::layout::DIRECT_MAP,
        cr3_value: crate::pae::layout::cr3_value,
        translate: crate::pae::translate::<FakeMem>,
    });
}
