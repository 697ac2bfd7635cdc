//! x86_32 PAE paging (3 levels) for the 32-bit flavour of the guest: the
//! 3G/1G layout and the builder of PTI page-table pairs, after Linux's
//! x86_32 PTI (v4.19: `arch/x86/mm/pti.c`, `arch/x86/mm/pgtable.c`).
//!
//! ```text
//! 0x0040_0000  USER_TEXT_BASE   user programs (as on x86_64)
//! 0x0060_0000  USER_STACK_TOP   top of the per-process user stack
//! 0xc000_0000  KERNEL_BASE      phys 0..768 MiB (the image at +1 MiB)
//! 0xf000_0000  TELEMETRY_VA     the telemetry page (4 KiB), fixed so that the
//!                               entry code counts with `addl/adcl abs32`
//! ```
//!
//! A page table is a 4-entry PDPT (32 bytes; CR3 holds its physical
//! address, below 4 GiB, 32-byte aligned); PDPTEs carry only present and
//! cache bits (RW, US, A and NX are reserved: a set one makes the CR3 load
//! fault), so permissions, and NX in particular, live in the PMDs and PTEs.
//! PDPT slots 0..=2 are user space, slot 3 the kernel GiB.
//!
//! PTI: every address space is an 8 KiB-aligned pair of PDPT pages, the
//! kernel copy at `pair`, the user copy at `pair + 4096` (CR3 bit 12 flips
//! between them, as Linux allocates 8 KiB pgds on x86_32 with PTI). The user
//! PMDs are shared by both copies; the kernel PMD is not: the user copy's
//! slot 3 points at a PMD of its own that maps only the entry area (entry
//! text, GDT, IDT, TSS, entry stack) with 4 KiB global pages, plus the kernel
//! text, global, with `pti_global_text=on` (the v6 change of the 2018 series).
//! Unlike x86_64, the kernel copy cannot mark user space NX at the top level
//! (PDPTEs have no NX bit, and Linux x86_32 does not poison it either).
//!
//! Entries are 64-bit, with the same bit layout as 4-level paging, so the
//! encoding ([`crate::pte::Pte`], [`crate::pte::flags`]) and the
//! [`PhysMem`]/[`FrameSource`] abstractions are shared with x86_64
//! (`crate::pte`).

use crate::pte::Tables;
use crate::pte::{flags::*, Translation, ADDR_MASK};
pub use crate::pte::{FrameSource, MapError, PhysMem, Pte, UserSpec};
use crate::pti::PagingMode;

/// Virtual layout of the PAE flavour.
pub mod layout {
    pub use crate::layout::{
        KERNEL_PHYS_BASE, PTI_USER_PGTABLE_BIT, USER_STACK_PAGES, USER_STACK_TOP, USER_TEXT_BASE,
    };
    /// Virtual address of physical address 0: the top GiB (3G/1G split).
    pub const KERNEL_BASE: u64 = 0xc000_0000;
    /// Bytes of physical memory in the direct map at [`KERNEL_BASE`]
    /// (Linux's lowmem is 896 MiB; here the rest of the GiB holds the
    /// telemetry page).
    pub const DIRECT_MAP_SIZE: u64 = 768 << 20;
    /// Fixed virtual address of the telemetry page.
    pub const TELEMETRY_VA: u64 = KERNEL_BASE + DIRECT_MAP_SIZE;
    /// Unused with PAE (no PCID); kept so shared code compiles unchanged.
    pub const CR3_NOFLUSH: u64 = 0;

    /// The PAE direct map (lowmem).
    pub const DIRECT_MAP: crate::layout::DirectMap = crate::layout::DirectMap {
        base: KERNEL_BASE,
        size: DIRECT_MAP_SIZE,
    };

    /// Kernel virtual address of a physical address in the direct map.
    pub const fn phys_to_virt(phys: u64) -> Option<u64> {
        DIRECT_MAP.phys_to_virt(phys)
    }

    /// Physical address of a direct-map virtual address, if it is one.
    pub const fn virt_to_phys(virt: u64) -> Option<u64> {
        DIRECT_MAP.virt_to_phys(virt)
    }

    /// CR3 value of an address space: the 8 KiB-aligned pair, bit 12 for
    /// the user copy. PAE has no PCID; the other arguments exist so that
    /// shared code calls both flavours alike and must be 0/false.
    pub const fn cr3_value(pair: u64, user: bool, _pcid: u64, _noflush: bool) -> u64 {
        let v = pair & !0x1fff;
        if user {
            v | PTI_USER_PGTABLE_BIT
        } else {
            v
        }
    }
}
use layout::{KERNEL_BASE, TELEMETRY_VA};

// The telemetry page and the whole kernel GiB fit in 32 bits.
const _: () = assert!(TELEMETRY_VA + 4096 <= 1 << 32);

/// Entries of a PDPT.
pub const PDPT_ENTRIES: usize = 4;
/// The kernel GiB's PDPT slot.
pub const KERNEL_PDPT_SLOT: usize = 3;
/// Bits a PDPTE may carry besides the address: present, PWT, PCD.
pub const PDPTE_ALLOWED: u64 = PRESENT | WRITE_THROUGH | NO_CACHE;
/// (PDPT, PMD, PT) indices of a 32-bit virtual address.
pub const fn indices(va: u64) -> [usize; 3] {
    [
        ((va >> 30) & 3) as usize,
        ((va >> 21) & 511) as usize,
        ((va >> 12) & 511) as usize,
    ]
}

/// A PDPTE pointing at the PMD `pmd`.
pub const fn pdpte(pmd: u64) -> u64 {
    (pmd & ADDR_MASK) | PRESENT
}

/// The PMD a PDPTE points to, creating it if absent.
fn pmd_of<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    pdpt: u64,
    slot: usize,
) -> Result<u64, MapError> {
    let e = Pte(mem.read(pdpt, slot));
    if e.present() {
        return Ok(e.addr());
    }
    let pmd = frames.frame().ok_or(MapError::OutOfFrames)?;
    mem.write(pdpt, slot, pdpte(pmd));
    Ok(pmd)
}

/// Maps the 4 KiB page at `va` in the PMD `pmd` (which covers `va`'s GiB).
pub fn map_4k_in_pmd<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    pmd: u64,
    va: u64,
    phys: u64,
    leaf_flags: u64,
    table_flags: u64,
) -> Result<(), MapError> {
    if va >> 32 != 0 {
        return Err(MapError::NotCanonical(va));
    }
    if !va.is_multiple_of(4096) || !phys.is_multiple_of(4096) {
        return Err(MapError::Misaligned(va));
    }
    let [_, i2, i1] = indices(va);
    let e = Pte(mem.read(pmd, i2));
    let pt = if e.present() {
        if e.huge() {
            return Err(MapError::AlreadyMapped(va));
        }
        e.addr()
    } else {
        let t = frames.frame().ok_or(MapError::OutOfFrames)?;
        mem.write(pmd, i2, Pte::new(t, table_flags).0);
        t
    };
    if Pte(mem.read(pt, i1)).present() {
        return Err(MapError::AlreadyMapped(va));
    }
    mem.write(pt, i1, Pte::new(phys, leaf_flags | PRESENT).0);
    Ok(())
}

/// Walks the PAE tree under `pdpt` for `va` as the MMU would; effective
/// USER/WRITABLE from every level below the PDPT, NX from any, GLOBAL from
/// the leaf. PDPTEs with reserved bits set translate nothing (the CPU
/// would refuse the CR3 load).
pub fn translate<M: PhysMem>(mem: &M, pdpt: u64, va: u64) -> Option<Translation> {
    if va >> 32 != 0 {
        return None;
    }
    let [i3, i2, i1] = indices(va);
    let e3 = Pte(mem.read(pdpt, i3));
    if !e3.present() || e3.flags() & !PDPTE_ALLOWED != 0 {
        return None;
    }
    let e2 = Pte(mem.read(e3.addr(), i2));
    if !e2.present() {
        return None;
    }
    let mut eff = PRESENT | WRITABLE | USER;
    eff &= e2.0 | !(WRITABLE | USER);
    eff |= e2.0 & NO_EXECUTE;
    if e2.huge() {
        return Some(Translation {
            phys: e2.addr() + (va & ((2 << 20) - 1)),
            flags: eff | (e2.0 & GLOBAL),
            page_size: 2 << 20,
        });
    }
    let e1 = Pte(mem.read(e2.addr(), i1));
    if !e1.present() {
        return None;
    }
    eff &= e1.0 | !(WRITABLE | USER);
    eff |= e1.0 & NO_EXECUTE;
    Some(Translation {
        phys: e1.addr() + (va & 4095),
        flags: eff | (e1.0 & GLOBAL),
        page_size: 4096,
    })
}

/// What the kernel GiB maps: the inputs of [`build_kernel_half`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSpec {
    /// Page table isolation on: kernel mappings non-global, user copy built.
    pub pti: bool,
    /// Physical `[start, end)` of the entry area (page aligned).
    pub entry_area: (u64, u64),
    /// Physical end of the entry text (the area's first part).
    pub entry_text_end: u64,
    /// Physical `[start, end)` of the kernel text (page aligned).
    pub text: (u64, u64),
    /// `pti_global_text=on`: kernel text global in both copies and mapped in
    /// the user copy.
    pub global_text: bool,
    /// The CPU has NX (EFER.NXE set): without it bit 63 is reserved.
    pub nx: bool,
    /// Physical address of the telemetry page (mapped at [`TELEMETRY_VA`]).
    pub telemetry: u64,
    /// Bytes of physical memory in the direct map (2 MiB multiple, ≤ 1 GiB − 2 MiB).
    pub direct_map: u64,
    /// `pti_switch=deferred`: physical `[start, end)` (page aligned, inside
    /// the first 2 MiB) of the Rust code that switches to the user copy on
    /// the way out, mapped in the user copy (read-only, executable, global)
    /// unless already there; `(0, 0)` otherwise.
    pub deferred_text: (u64, u64),
}

/// The kernel GiB shared by every address space: the PMD of the kernel
/// copy, and that of the user copy (the same one without PTI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelHalf {
    /// Physical address of the kernel copy's kernel PMD (page directory).
    pub kernel_pmd: u64,
    /// Physical address of the user copy's kernel PMD (`kernel_pmd` without PTI).
    pub user_pmd: u64,
    /// Whether PTI is on.
    pub pti: bool,
    /// 4 KiB kernel pages the user copy maps (entry area, + text if global).
    pub user_kernel_pages: u64,
}

impl KernelHalf {
    /// No kernel GiB yet (all zero, PTI off).
    pub const EMPTY: KernelHalf = KernelHalf {
        kernel_pmd: 0,
        user_pmd: 0,
        pti: false,
        user_kernel_pages: 0,
    };
}

/// Builds the kernel GiB ([`crate::pti::build_kernel_half`]). The first 2
/// MiB (boot section and kernel image) are mapped with 4 KiB pages so that,
/// with PTI, the entry area and (with `global_text`) the text can be global
/// while the rest is not; the rest of the direct map uses 2 MiB pages,
/// global unless PTI is on.
pub fn build_kernel_half<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    spec: &KernelSpec,
) -> Result<KernelHalf, MapError> {
    let spec = crate::pti::KernelSpec {
        pti: spec.pti,
        entry_area: spec.entry_area,
        entry_text_end: spec.entry_text_end,
        text: spec.text,
        global_text: spec.global_text,
        nx: spec.nx,
        telemetry: spec.telemetry,
        direct_map: spec.direct_map,
        deferred_text: spec.deferred_text,
    };
    crate::pti::build_kernel_half::<Pae, M, F>(mem, frames, &spec)
}

/// A kernel-only page table (the user slots empty), for kmain before any
/// process exists. Returns the 8 KiB-aligned pair (only the kernel copy used).
pub fn build_kernel_only<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    half: &KernelHalf,
) -> Result<u64, MapError> {
    Pae::kernel_only(mem, frames, half)
}

/// Builds a process's PDPT pair and returns its physical address. The
/// user PMD is shared by both copies; slot 3 differs with PTI.
pub fn build_address_space<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    half: &KernelHalf,
    user: &UserSpec,
    nx: bool,
) -> Result<u64, MapError> {
    crate::pti::build_address_space::<Pae, M, F>(mem, frames, half, user, nx)
}

/// Maps one more user stack page (user, writable, NX when the CPU has it)
/// at `va` into the address space `pair`: a thread's own stack in a shared
/// address space. Both copies share the user PMD, so both see it.
pub fn map_user_stack_page<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    pair: u64,
    va: u64,
    phys: u64,
    nx: bool,
) -> Result<(), MapError> {
    crate::pti::map_user_stack_page::<Pae, M, F>(mem, frames, pair, va, phys, nx)
}

/// Opts an address space out of PTI: the user copy's kernel slot becomes
/// the kernel copy's, so both copies map everything.
pub fn opt_out_of_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &KernelHalf) {
    Pae::opt_out_of_pti(mem, pair, half)
}

/// Undoes [`opt_out_of_pti`].
pub fn opt_in_to_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &KernelHalf) {
    Pae::opt_in_to_pti(mem, pair, half)
}

/// x86_32's PAE paging as a [`PagingMode`]: a half table is a PMD (the
/// kernel GiB's, PDPT slot 3); a process's user table is its user PMD
/// (slot 0), pointed at by both copies. PDPTEs carry only the present bit:
/// unlike 4-level paging, the kernel copy cannot mark the user half NX at
/// the top (Linux x86_32 does not poison it either).
pub struct Pae;

impl PagingMode for Pae {
    type Half = KernelHalf;
    const KERNEL_BASE: u64 = KERNEL_BASE;
    const TELEMETRY_VA: u64 = TELEMETRY_VA;
    const SMALL_FIRST_2M: bool = true;

    fn map_4k<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        table: u64,
        va: u64,
        phys: u64,
        leaf_flags: u64,
        table_flags: u64,
    ) -> Result<(), MapError> {
        map_4k_in_pmd(mem, frames, table, va, phys, leaf_flags, table_flags)
    }

    /// Page by page for 4 KiB leaves; 2 MiB ones are entries of the PMD
    /// itself, written as one run. The range must stay in the PMD's GiB.
    fn map_run<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        table: u64,
        va: u64,
        phys: u64,
        len: u64,
        page: u64,
        leaf_flags: u64,
        table_flags: u64,
    ) -> Result<(), MapError> {
        if (page != 4096 && page != 2 << 20) || (va | phys | len) & (page - 1) != 0 {
            return Err(MapError::Misaligned(va));
        }
        let end = va.checked_add(len).ok_or(MapError::NotCanonical(va))?;
        if end > 1 << 32 || (len > 0 && va >> 30 != (end - 1) >> 30) {
            return Err(MapError::NotCanonical(end.wrapping_sub(1)));
        }
        if page == 4096 {
            let mut off = 0;
            while off < len {
                map_4k_in_pmd(
                    mem,
                    frames,
                    table,
                    va + off,
                    phys + off,
                    leaf_flags,
                    table_flags,
                )?;
                off += 4096;
            }
            return Ok(());
        }
        let index = indices(va)[1];
        let first = Pte::new(phys, leaf_flags | PRESENT | HUGE).0;
        mem.fill(table, index, (len >> 21) as usize, first, page)
            .map_err(|i| MapError::AlreadyMapped(va + (i - index) as u64 * page))
    }

    fn page_table<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        table: u64,
        va: u64,
        table_flags: u64,
    ) -> Result<u64, MapError> {
        let i2 = indices(va)[1];
        let e = Pte(mem.read(table, i2));
        if e.present() {
            if e.huge() {
                return Err(MapError::AlreadyMapped(va));
            }
            return Ok(e.addr());
        }
        let pt = frames.frame().ok_or(MapError::OutOfFrames)?;
        mem.write(table, i2, Pte::new(pt, table_flags).0);
        Ok(pt)
    }

    fn half<M: PhysMem>(_: &M, kernel: u64, user: Option<(u64, u64)>) -> KernelHalf {
        match user {
            Some((table, pages)) => KernelHalf {
                kernel_pmd: kernel,
                user_pmd: table,
                pti: true,
                user_kernel_pages: pages,
            },
            None => KernelHalf {
                kernel_pmd: kernel,
                user_pmd: kernel,
                pti: false,
                user_kernel_pages: 0,
            },
        }
    }

    fn kernel_only<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        half: &KernelHalf,
    ) -> Result<u64, MapError> {
        let pair = frames.pair().ok_or(MapError::OutOfFrames)?;
        mem.write(pair, KERNEL_PDPT_SLOT, pdpte(half.kernel_pmd));
        mem.write(pair + 4096, KERNEL_PDPT_SLOT, pdpte(half.user_pmd));
        Ok(pair)
    }

    /// The user PMD, hung in the kernel copy's slot 0 (both user pages and
    /// stack live in its GiB).
    fn new_user_table<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        pair: u64,
    ) -> Result<u64, MapError> {
        use layout::{USER_STACK_TOP, USER_TEXT_BASE};
        let slot = indices(USER_TEXT_BASE)[0];
        debug_assert_eq!(indices(USER_STACK_TOP - 4096)[0], slot);
        pmd_of(mem, frames, pair, slot)
    }

    fn user_table<M: PhysMem>(mem: &M, pair: u64) -> Option<u64> {
        let slot = indices(layout::USER_TEXT_BASE)[0];
        let e = Pte(mem.read(pair, slot));
        e.present().then_some(e.addr())
    }

    fn install<M: PhysMem>(mem: &mut M, pair: u64, user_table: u64, half: &KernelHalf) {
        let slot = indices(layout::USER_TEXT_BASE)[0];
        mem.write(pair + 4096, slot, pdpte(user_table));
        mem.write(pair, KERNEL_PDPT_SLOT, pdpte(half.kernel_pmd));
        mem.write(pair + 4096, KERNEL_PDPT_SLOT, pdpte(half.user_pmd));
    }

    fn opt_out_of_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &KernelHalf) {
        mem.write(pair + 4096, KERNEL_PDPT_SLOT, pdpte(half.kernel_pmd));
    }

    fn opt_in_to_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &KernelHalf) {
        mem.write(pair + 4096, KERNEL_PDPT_SLOT, pdpte(half.user_pmd));
    }

    fn tables(user_table: u64) -> Tables {
        Tables::PaePmd(user_table)
    }

    fn kernel_tables<M: PhysMem, F: FrameSource>(
        _: &mut M,
        _: &mut F,
        half: &KernelHalf,
    ) -> Result<Tables, MapError> {
        Ok(Tables::PaePmd(half.kernel_pmd))
    }
}

#[cfg(test)]
mod tests {
    use super::layout::*;
    use super::*;
    use std::collections::BTreeMap;
    use std::vec::Vec;

    #[derive(Default)]
    struct FakeMem(BTreeMap<(u64, usize), u64>);
    impl PhysMem for FakeMem {
        fn read(&self, table: u64, index: usize) -> u64 {
            assert_eq!(table % 32, 0, "tables are at least 32-byte aligned");
            assert!(index < 512);
            *self.0.get(&(table, index)).unwrap_or(&0)
        }
        fn write(&mut self, table: u64, index: usize, value: u64) {
            assert_eq!(table % 32, 0);
            assert!(index < 512);
            self.0.insert((table, index), value);
        }
    }
    struct Bump {
        next: u64,
        handed: Vec<u64>,
    }
    impl FrameSource for Bump {
        fn frame(&mut self) -> Option<u64> {
            let f = self.next;
            self.next += 4096;
            self.handed.push(f);
            Some(f)
        }
        fn pair(&mut self) -> Option<u64> {
            self.next = (self.next + 8191) & !8191;
            let p = self.frame()?;
            self.frame()?;
            Some(p)
        }
    }

    const ENTRY: (u64, u64) = (0x10_2000, 0x10_5000);
    const ENTRY_TEXT_END: u64 = 0x10_3000;
    const TEXT: (u64, u64) = (0x10_5000, 0x11_0000);
    const KDATA: u64 = 0x11_8000;
    const TELEMETRY: u64 = 0x7fff000;

    fn spec(pti: bool, global_text: bool) -> KernelSpec {
        KernelSpec {
            pti,
            entry_area: ENTRY,
            entry_text_end: ENTRY_TEXT_END,
            text: TEXT,
            global_text,
            nx: true,
            telemetry: TELEMETRY,
            direct_map: DIRECT_MAP_SIZE,
            deferred_text: (0, 0),
        }
    }
    fn user() -> UserSpec {
        UserSpec {
            text_phys: 0x12_0000,
            text_pages: 2,
            stack: [0x13_0000, 0x13_1000],
        }
    }
    fn setup(pti: bool, global_text: bool) -> (FakeMem, Bump, KernelHalf, u64) {
        let mut m = FakeMem::default();
        let mut f = Bump {
            next: 0x20_0000,
            handed: Vec::new(),
        };
        let half = build_kernel_half(&mut m, &mut f, &spec(pti, global_text)).unwrap();
        let pair = build_address_space(&mut m, &mut f, &half, &user(), true).unwrap();
        (m, f, half, pair)
    }
    /// Every present leaf under a PMD: (va, pte).
    fn leaves(m: &FakeMem, pmd: u64, gib: u64) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        for i2 in 0..512 {
            let e2 = Pte(m.read(pmd, i2));
            if !e2.present() {
                continue;
            }
            let va2 = (gib << 30) + ((i2 as u64) << 21);
            if e2.huge() {
                v.push((va2, e2.0));
                continue;
            }
            for i1 in 0..512 {
                let e1 = Pte(m.read(e2.addr(), i1));
                if e1.present() {
                    v.push((va2 + ((i1 as u64) << 12), e1.0));
                }
            }
        }
        v
    }

    #[test]
    fn extra_stack_pages_show_in_both_copies() {
        for pti in [false, true] {
            let (mut m, mut f, _, pair) = setup(pti, false);
            let va = USER_STACK_TOP - 5 * 4096;
            map_user_stack_page(&mut m, &mut f, pair, va, 0x14_0000, true).unwrap();
            for root in [pair, pair + 4096] {
                let t = translate(&m, root, va + 8).unwrap();
                assert_eq!(t.phys, 0x14_0008);
                assert_eq!(
                    t.flags & (USER | WRITABLE | NO_EXECUTE),
                    USER | WRITABLE | NO_EXECUTE
                );
            }
            assert_eq!(
                map_user_stack_page(&mut m, &mut f, pair, va, 0x15_0000, true),
                Err(MapError::AlreadyMapped(va))
            );
            assert!(
                map_user_stack_page(&mut m, &mut f, pair, USER_STACK_TOP, 0x15_0000, true).is_err()
            );
        }
    }

    #[test]
    fn layout_is_3g_1g() {
        assert_eq!(KERNEL_BASE, 3 << 30);
        assert_eq!(indices(KERNEL_BASE), [3, 0, 0]);
        assert_eq!(indices(KERNEL_BASE + 0x10_2000), [3, 0, 0x102]);
        assert_eq!(indices(TELEMETRY_VA), [3, 384, 0]);
        assert_eq!(indices(USER_TEXT_BASE), [0, 2, 0]);
        assert_eq!(indices(USER_STACK_TOP - 1)[..2], [0, 2]);
        assert_eq!(phys_to_virt(0x10_0000), Some(0xc010_0000));
        assert_eq!(phys_to_virt(DIRECT_MAP_SIZE), None);
        assert_eq!(virt_to_phys(0xc010_0000), Some(0x10_0000));
        assert_eq!(cr3_value(0x20_2000, true, 0, false), 0x20_3000);
        assert_eq!(cr3_value(0x20_3000, false, 0, false), 0x20_2000);
    }

    #[test]
    fn pdpt_constraints() {
        for pti in [false, true] {
            let (m, _, _, pair) = setup(pti, false);
            assert_eq!(pair % 8192, 0, "pair 8 KiB aligned");
            assert!(pair + 8192 <= 1 << 32, "PDPTs below 4 GiB");
            for root in [pair, pair + 4096] {
                assert_eq!(root % 32, 0);
                for i in 0..PDPT_ENTRIES {
                    let e = m.read(root, i);
                    assert_eq!(e & !ADDR_MASK & !PDPTE_ALLOWED, 0, "PDPTE {i}: {e:#x}");
                }
                for i in PDPT_ENTRIES..512 {
                    assert_eq!(m.read(root, i), 0, "a PDPT has 4 entries");
                }
                assert!(Pte(m.read(root, 3)).present());
                assert!(Pte(m.read(root, 0)).present());
                assert!(!Pte(m.read(root, 1)).present() && !Pte(m.read(root, 2)).present());
            }
        }
    }

    #[test]
    fn user_pmd_shared_kernel_pmd_not() {
        let (m, _, half, pair) = setup(true, false);
        assert_eq!(m.read(pair, 0), m.read(pair + 4096, 0), "user PMD shared");
        assert_ne!(
            m.read(pair, 3),
            m.read(pair + 4096, 3),
            "kernel PMD not shared"
        );
        assert_eq!(Pte(m.read(pair, 3)).addr(), half.kernel_pmd);
        assert_eq!(Pte(m.read(pair + 4096, 3)).addr(), half.user_pmd);
        // Without PTI both copies are the same table.
        let (m, _, _, pair) = setup(false, false);
        for i in 0..4 {
            assert_eq!(m.read(pair, i), m.read(pair + 4096, i));
        }
    }

    #[test]
    fn kernel_copy_maps_the_direct_map_and_telemetry() {
        let (m, _, _, pair) = setup(true, false);
        let k = translate(&m, pair, KERNEL_BASE + KDATA).unwrap();
        assert_eq!((k.phys, k.page_size), (KDATA, 4096));
        assert_eq!(k.flags & (GLOBAL | USER), 0, "non-global with PTI");
        let big = translate(&m, pair, KERNEL_BASE + (100 << 20) + 5).unwrap();
        assert_eq!((big.phys, big.page_size), ((100 << 20) + 5, 2 << 20));
        let last = translate(&m, pair, KERNEL_BASE + DIRECT_MAP_SIZE - 1).unwrap();
        assert_eq!(last.phys, DIRECT_MAP_SIZE - 1);
        let t = translate(&m, pair, TELEMETRY_VA + 8).unwrap();
        assert_eq!(t.phys, TELEMETRY + 8);
        assert!(t.flags & NO_EXECUTE != 0);
        assert_eq!(translate(&m, pair, TELEMETRY_VA + 4096), None);
        // Without PTI the kernel is global.
        let (m, _, _, pair) = setup(false, false);
        let k = translate(&m, pair + 4096, KERNEL_BASE + KDATA).unwrap();
        assert!(k.flags & GLOBAL != 0);
    }

    #[test]
    fn pti_user_copy_maps_only_the_entry_area() {
        let (m, _, half, pair) = setup(true, false);
        let u = pair + 4096;
        let l = leaves(&m, Pte(m.read(u, 3)).addr(), 3);
        assert_eq!(l.len() as u64, (ENTRY.1 - ENTRY.0) / 4096);
        assert_eq!(half.user_kernel_pages, l.len() as u64);
        for (va, pte) in l {
            let pa = Pte(pte).addr();
            assert!((ENTRY.0..ENTRY.1).contains(&pa), "{va:#x} → {pa:#x}");
            assert_eq!(va, KERNEL_BASE + pa);
            assert!(pte & GLOBAL != 0 && pte & USER == 0 && pte & HUGE == 0);
            let text = pa < ENTRY_TEXT_END;
            assert_eq!(pte & (WRITABLE | NO_EXECUTE) == 0, text);
        }
        for va in [
            KERNEL_BASE + KDATA,
            KERNEL_BASE + TEXT.0,
            TELEMETRY_VA,
            KERNEL_BASE,
        ] {
            assert_eq!(translate(&m, u, va), None, "{va:#x}");
        }
        // User space is the same in both copies.
        let a = translate(&m, pair, USER_TEXT_BASE + 4096 + 3).unwrap();
        let b = translate(&m, u, USER_TEXT_BASE + 4096 + 3).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.phys, 0x12_1003);
        assert_eq!(a.flags & (USER | WRITABLE | NO_EXECUTE), USER);
        let s = translate(&m, u, USER_STACK_TOP - 4).unwrap();
        assert_eq!(s.phys, 0x13_1ffc);
        assert_eq!(
            s.flags & (USER | WRITABLE | NO_EXECUTE),
            USER | WRITABLE | NO_EXECUTE
        );
        assert_eq!(translate(&m, u, USER_STACK_TOP), None);
    }

    #[test]
    fn global_text_adds_the_text_to_the_user_copy() {
        let (m, _, half, pair) = setup(true, true);
        let u = pair + 4096;
        let entry_pages = (ENTRY.1 - ENTRY.0) / 4096;
        let text_pages = (TEXT.1 - TEXT.0) / 4096;
        assert_eq!(half.user_kernel_pages, entry_pages + text_pages);
        let t = translate(&m, u, KERNEL_BASE + TEXT.0 + 4096).unwrap();
        assert_eq!(t.flags & (GLOBAL | WRITABLE | NO_EXECUTE), GLOBAL);
        // And global in the kernel copy too, so the TLB entries survive the switch.
        let k = translate(&m, pair, KERNEL_BASE + TEXT.0 + 4096).unwrap();
        assert!(k.flags & GLOBAL != 0);
        assert!(translate(&m, pair, KERNEL_BASE + KDATA).unwrap().flags & GLOBAL == 0);
        assert_eq!(translate(&m, u, KERNEL_BASE + KDATA), None);
        assert_eq!(translate(&m, u, KERNEL_BASE + TEXT.1), None);
    }

    #[test]
    fn deferred_switch_text_is_mapped_in_the_user_copy_and_nothing_more() {
        let mut m = FakeMem::default();
        let mut f = Bump {
            next: 0x20_0000,
            handed: Vec::new(),
        };
        let s = KernelSpec {
            deferred_text: (TEXT.0 + 4096, TEXT.0 + 8192),
            ..spec(true, false)
        };
        let half = build_kernel_half(&mut m, &mut f, &s).unwrap();
        let pair = build_address_space(&mut m, &mut f, &half, &user(), true).unwrap();
        let u = pair + 4096;
        let entry_pages = (ENTRY.1 - ENTRY.0) / 4096;
        assert_eq!(half.user_kernel_pages, entry_pages + 1);
        // Read-only, executable, global kernel text.
        let t = translate(&m, u, KERNEL_BASE + TEXT.0 + 4096).unwrap();
        assert_eq!(t.phys, TEXT.0 + 4096);
        assert_eq!(t.flags & (GLOBAL | WRITABLE | NO_EXECUTE | USER), GLOBAL);
        // Only that page of the text, no kernel data.
        assert_eq!(translate(&m, u, KERNEL_BASE + TEXT.0), None);
        assert_eq!(translate(&m, u, KERNEL_BASE + TEXT.0 + 8192), None);
        assert_eq!(translate(&m, u, KERNEL_BASE + KDATA), None);
        // With the whole text global it is not mapped (or counted) twice.
        let mut m = FakeMem::default();
        let s = KernelSpec {
            deferred_text: (TEXT.0 + 4096, TEXT.0 + 8192),
            ..spec(true, true)
        };
        let half = build_kernel_half(&mut m, &mut f, &s).unwrap();
        assert_eq!(
            half.user_kernel_pages,
            entry_pages + (TEXT.1 - TEXT.0) / 4096
        );
    }

    #[test]
    fn without_nx_no_bit_63() {
        let mut m = FakeMem::default();
        let mut f = Bump {
            next: 0x20_0000,
            handed: Vec::new(),
        };
        let s = KernelSpec {
            nx: false,
            ..spec(true, false)
        };
        let half = build_kernel_half(&mut m, &mut f, &s).unwrap();
        build_address_space(&mut m, &mut f, &half, &user(), false).unwrap();
        assert!(m.0.values().all(|v| v & NO_EXECUTE == 0));
    }

    #[test]
    fn opt_out_and_in() {
        let (mut m, _, half, pair) = setup(true, false);
        opt_out_of_pti(&mut m, pair, &half);
        assert!(translate(&m, pair + 4096, KERNEL_BASE + KDATA).is_some());
        opt_in_to_pti(&mut m, pair, &half);
        assert_eq!(translate(&m, pair + 4096, KERNEL_BASE + KDATA), None);
    }

    #[test]
    fn kernel_only_root() {
        let mut m = FakeMem::default();
        let mut f = Bump {
            next: 0x20_1000,
            handed: Vec::new(),
        };
        let half = build_kernel_half(&mut m, &mut f, &spec(true, false)).unwrap();
        let root = build_kernel_only(&mut m, &mut f, &half).unwrap();
        assert_eq!(root % 8192, 0);
        assert!(translate(&m, root, KERNEL_BASE + KDATA).is_some());
        assert_eq!(translate(&m, root, USER_TEXT_BASE), None);
    }
}
