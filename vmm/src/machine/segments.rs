//! Flat segment registers for a vCPU's first instruction, written once for
//! the VMM's PVH boot and the probe's tiny guests alike: base 0, 4 GiB
//! limit, one code, one data and one TSS selector, in 32-bit protected mode
//! or 64-bit long mode.

use kvm_bindings::{kvm_segment, kvm_sregs};

/// The selectors (and TSS base) of a flat set-up. They must match the GDT
/// the guest will load, so that reloading a segment register changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlatSelectors {
    /// Code segment selector (CS).
    pub code: u16,
    /// Data segment selector (DS, ES, FS, GS, SS).
    pub data: u16,
    /// Task register selector (TR).
    pub tss: u16,
    /// Guest-linear base address of the TSS.
    pub tss_base: u64,
}

/// Sets CS/DS/ES/FS/GS/SS and TR of `sregs` flat: code execute/read,
/// data read/write, a busy TSS of 0x68 bytes at `sel.tss_base`. `long_mode`
/// makes CS a 64-bit code segment (L=1, D=0), else a 32-bit one (D=1).
pub fn set_flat(sregs: &mut kvm_sregs, sel: FlatSelectors, long_mode: bool) {
    let code = kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: sel.code,
        type_: 0xb, // execute/read, accessed
        present: 1,
        dpl: 0,
        db: u8::from(!long_mode),
        s: 1,
        l: u8::from(long_mode),
        g: 1,
        ..Default::default()
    };
    let data = kvm_segment {
        selector: sel.data,
        type_: 0x3, // read/write, accessed
        db: 1,
        l: 0,
        ..code
    };
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment {
        base: sel.tss_base,
        limit: 0x67,
        selector: sel.tss,
        type_: 0xb, // busy 32-bit (or 64-bit) TSS
        present: 1,
        ..Default::default()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_and_protected_mode_code_segments() {
        let sel = FlatSelectors {
            code: 0x08,
            data: 0x10,
            tss: 0x18,
            tss_base: 0,
        };
        let mut s = kvm_sregs::default();
        set_flat(&mut s, sel, false);
        assert_eq!((s.cs.db, s.cs.l, s.cs.selector), (1, 0, 0x08));
        assert_eq!((s.ss.type_, s.ss.db, s.ss.selector), (3, 1, 0x10));
        assert_eq!((s.tr.type_, s.tr.s, s.tr.limit), (0xb, 0, 0x67));
        set_flat(&mut s, sel, true);
        assert_eq!((s.cs.db, s.cs.l), (0, 1));
        assert_eq!(s.ds.l, 0);
    }
}
