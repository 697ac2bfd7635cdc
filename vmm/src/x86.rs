//! x86 architectural numbers that the VMM's vCPU set-up, the probe's
//! guests and the host page-table walker share: control-register and EFER
//! bits, MSR numbers, page-table entry bits. Written once here (a leaf: it
//! imports nothing), so that no two places spell the same bit.

/// CR0 bits.
pub mod cr0 {
    /// PE: protected mode.
    pub const PE: u64 = 1 << 0;
    /// ET: extension type (reads as 1 on every CPU since the 486).
    pub const ET: u64 = 1 << 4;
    /// PG: paging.
    pub const PG: u64 = 1 << 31;
}

/// CR4 bits.
pub mod cr4 {
    /// PSE: 4 MiB pages under 32-bit paging.
    pub const PSE: u64 = 1 << 4;
    /// PAE: physical address extension (also needed for long mode).
    pub const PAE: u64 = 1 << 5;
    /// PCIDE: process-context identifiers.
    pub const PCIDE: u64 = 1 << 17;
}

/// IA32_EFER bits.
pub mod efer {
    /// SCE: SYSCALL/SYSRET enabled.
    pub const SCE: u64 = 1 << 0;
    /// LME: long mode enabled.
    pub const LME: u64 = 1 << 8;
    /// LMA: long mode active.
    pub const LMA: u64 = 1 << 10;
}

/// MSR numbers.
pub mod msr {
    /// IA32_SYSENTER_CS.
    pub const SYSENTER_CS: u32 = 0x174;
    /// IA32_SYSENTER_ESP.
    pub const SYSENTER_ESP: u32 = 0x175;
    /// IA32_SYSENTER_EIP.
    pub const SYSENTER_EIP: u32 = 0x176;
    /// IA32_EFER.
    pub const EFER: u32 = 0xc000_0080;
    /// STAR: SYSCALL's and SYSRET's segment selectors.
    pub const STAR: u32 = 0xc000_0081;
    /// LSTAR: SYSCALL's 64-bit target.
    pub const LSTAR: u32 = 0xc000_0082;
    /// FMASK: RFLAGS bits SYSCALL clears.
    pub const FMASK: u32 = 0xc000_0084;
}

/// Page-table entry bits (4-level and PAE entries alike).
pub mod pte {
    /// P: the entry is valid.
    pub const PRESENT: u64 = 1 << 0;
    /// R/W: writes allowed.
    pub const WRITABLE: u64 = 1 << 1;
    /// U/S: user-mode access allowed.
    pub const USER: u64 = 1 << 2;
    /// PS: a large leaf in a page directory (or a 1 GiB one in a PDPT).
    pub const HUGE: u64 = 1 << 7;
    /// G: global (kept across CR3 writes when CR4.PGE is set).
    pub const GLOBAL: u64 = 1 << 8;
    /// XD: no instruction fetch.
    pub const NO_EXECUTE: u64 = 1 << 63;
    /// The physical address of the next table or page (bits 12..52).
    pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
}
