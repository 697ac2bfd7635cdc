//! Hand-assembled machine code and system tables for the probe guests.
//!
//! No assembler is available at build time, so every instruction the probes
//! use is one method of [`Asm`] that appends its documented encoding. Only
//! instructions whose encoding is the same in 32-bit protected mode and
//! 64-bit mode (or that say which mode they are for) are offered, and the
//! probes stay away from what HOST-KVM.md lists as fatal at CPL0 under the
//! software virtualizer (INVPCID, RDTSCP, INT3 at CPL0, SSE).
//!
//! Guest-physical layout of every probe VM (identity-mapped, so guest
//! virtual = guest physical):
//!
//! | GPA | what |
//! | --- | --- |
//! | `0x1000` | PML4 |
//! | `0x2000` | PDPT (long mode) |
//! | `0x3000` | page directory: one 2 MiB page at 0, P/RW/US |
//! | `0x4000` | GDT (Linux selector layout) with the TSS descriptor at `0x40` |
//! | `0x5000` | IDT (64-bit or 32-bit gates, all DPL 3) |
//! | `0x6000` | 64-bit TSS (RSP0 = kernel stack top) |
//! | `0x7000` | per-vector handler stubs, common handler at `0x7800` |
//! | `0x8000` | kernel code of the probe |
//! | `0x8800` | SYSCALL landing (LSTAR) |
//! | `0x8900` | SYSENTER landing (SYSENTER_EIP) |
//! | `0x9000` | user code of the probe |
//! | `0xb000` | user stack top (stack grows down from here) |
//! | `0xc000` | kernel stack top (TSS.RSP0, SYSENTER_ESP, initial RSP) |
//! | `0xd000` | PAE page-directory-pointer table (32-bit PAE probe) |
//! | `0xe000` | legacy 32-bit page directory (legacy paging probe) |
//!
//! Size: hand-assembled machine code for the probe guests (no assembler at
//! build time), one program per probe with the constants they share; about 60
//! lines are tests.

use crate::x86::pte;

/// Size of a probe VM's RAM, starting at GPA 0.
pub const MEM_SIZE: usize = 0x10000;

/// PML4 (long-mode probes).
pub const PML4: u64 = 0x1000;
/// PDPT of the long-mode tables.
pub const PDPT: u64 = 0x2000;
/// Page directory: one 2 MiB page at 0, present, writable, user.
pub const PD: u64 = 0x3000;
/// GDT, Linux selector layout, TSS descriptor at `0x40`.
pub const GDT: u64 = 0x4000;
/// IDT (64-bit or 32-bit gates, all DPL 3).
pub const IDT: u64 = 0x5000;
/// 64-bit TSS (RSP0 = [`KERNEL_STACK_TOP`]).
pub const TSS: u64 = 0x6000;
/// The 256 per-vector handler stubs.
pub const STUBS: u64 = 0x7000;
/// The common handler the stubs jump to.
pub const COMMON_HANDLER: u64 = 0x7800;
/// Kernel code of the probe.
pub const KERNEL_CODE: u64 = 0x8000;
/// SYSCALL landing (LSTAR).
pub const SYSCALL_LANDING: u64 = 0x8800;
/// SYSENTER landing (SYSENTER_EIP).
pub const SYSENTER_LANDING: u64 = 0x8900;
/// User code of the probe.
pub const USER_CODE: u64 = 0x9000;
/// User stack top (grows down).
pub const USER_STACK_TOP: u64 = 0xb000;
/// Kernel stack top (TSS.RSP0, SYSENTER_ESP, initial RSP).
pub const KERNEL_STACK_TOP: u64 = 0xc000;
/// PAE page-directory-pointer table (32-bit PAE probe).
pub const PAE_PDPT: u64 = 0xd000;
/// Legacy 32-bit page directory (legacy paging probe).
pub const LEGACY_PD: u64 = 0xe000;

// Every table lies inside RAM.
const _: () = assert!(LEGACY_PD + 0x1000 <= MEM_SIZE as u64);
// The stubs end before the common handler.
const _: () = assert!(STUBS + 256 * STUB_LEN <= COMMON_HANDLER);

/// Bytes per handler stub: `mov al, v` (2) + `jmp rel32` (5).
const STUB_LEN: u64 = 7;

/// FMASK as Linux sets it, minus what does not matter here: TF, IF, DF.
pub const SYSCALL_FMASK: u64 = 0x700;

/// The MSRs a probe's SYSCALL needs (with EFER.SCE): STAR with SYSCALL's
/// CS 0x10/SS 0x18 and SYSRET's CS 0x33/SS 0x2b (Linux's layout), LSTAR at
/// [`SYSCALL_LANDING`], FMASK [`SYSCALL_FMASK`].
pub fn syscall_msrs() -> [(u32, u64); 3] {
    [
        (
            crate::x86::msr::STAR,
            (u64::from(sel::USER_CS32) << 48) | (u64::from(sel::KERNEL_CS) << 32),
        ),
        (crate::x86::msr::LSTAR, SYSCALL_LANDING),
        (crate::x86::msr::FMASK, SYSCALL_FMASK),
    ]
}

/// GDT selectors (Linux's x86_64 layout, so that STAR works as Linux sets it).
pub mod sel {
    /// Flat 32-bit kernel code (the protected-mode probes start here).
    pub const KERNEL_CS32: u16 = 0x08;
    /// 64-bit kernel code.
    pub const KERNEL_CS: u16 = 0x10;
    /// Flat kernel data.
    pub const KERNEL_DS: u16 = 0x18;
    /// 32-bit user code (`STAR[63:48]` base), RPL 3.
    pub const USER_CS32: u16 = 0x23;
    /// Flat user data, RPL 3.
    pub const USER_DS: u16 = 0x2b;
    /// 64-bit user code, RPL 3.
    pub const USER_CS: u16 = 0x33;
    /// 64-bit TSS (two GDT slots).
    pub const TSS: u16 = 0x40;
}

/// GDT limit: 8 descriptors of 8 bytes plus the 16-byte TSS descriptor.
pub const GDT_LIMIT: u16 = 0x50 - 1;

/// Report addresses: unbacked guest-physical addresses just above RAM. A
/// 32-bit store there exits to the VMM as KVM_EXIT_MMIO at any CPL. (Port
/// I/O would need IOPL 3 at CPL3, which kvm-pvm does not honour: `out`
/// #GPs in user mode there.) The page tables map them like RAM.
pub mod report {
    /// The first report address; all of them lie in one 64-byte block.
    pub const BASE: u64 = super::MEM_SIZE as u64;
    /// The vector of the interrupt gate that was entered (low byte).
    pub const VECTOR: u64 = BASE;
    /// CS at a handler (its RPL is the CPL the handler runs at).
    pub const HANDLER_CS: u64 = BASE + 0x04;
    /// Three stores: the first three 8-byte stack slots at handler entry
    /// (low halves): `[err,] rip, cs, ...`.
    pub const FRAME: u64 = BASE + 0x08;
    /// A progress marker of straight-line probe code.
    pub const STAGE: u64 = BASE + 0x0c;
    /// A measured value (MSR halves, CPUID registers, TSC halves, RFLAGS).
    pub const VALUE: u64 = BASE + 0x10;
    /// CS seen by user code, before and after the tested instruction.
    pub const USER_CS: u64 = BASE + 0x14;
    /// CS at the SYSCALL/SYSENTER landing point or after a far jump.
    pub const LANDING_CS: u64 = BASE + 0x18;
    /// The probe's code ran to its end. The run stops here.
    pub const END: u64 = BASE + 0x1c;
    /// One past the last report address.
    pub const LIMIT: u64 = BASE + 0x40;
    /// Bits that carry data at `addr` (the rest of EAX is not meaningful).
    pub fn mask(addr: u64) -> u64 {
        match addr {
            VECTOR | STAGE => 0xff,
            HANDLER_CS | USER_CS | LANDING_CS => 0xffff,
            _ => 0xffff_ffff,
        }
    }
}

/// An append-only x86 code buffer at a known guest address.
///
/// Each method appends one instruction; its comment gives the encoding.
/// Methods marked "64-bit" must only run in 64-bit mode, "32-bit" only in
/// 32-bit protected mode; the others encode the same in both.
#[derive(Debug, Clone)]
pub struct Asm {
    origin: u64,
    bytes: Vec<u8>,
}

impl Asm {
    /// An empty buffer whose first instruction will sit at guest address `origin`.
    pub fn new(origin: u64) -> Self {
        Asm {
            origin,
            bytes: Vec::new(),
        }
    }

    /// Guest address of the next instruction.
    pub fn here(&self) -> u64 {
        self.origin + self.bytes.len() as u64
    }

    /// Guest address of the first instruction.
    pub fn origin(&self) -> u64 {
        self.origin
    }

    /// The encoded instructions so far.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn emit(&mut self, b: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(b);
        self
    }

    /// `mov [disp32], eax`: 89 04 25 id. ModRM 00 000 100 selects a SIB
    /// byte; SIB 00 100 101 means no index and no base, so the address is
    /// the absolute disp32 in 32-bit and 64-bit mode alike (the plain
    /// ModRM 05 form would be RIP-relative in 64-bit mode).
    pub fn store_eax(&mut self, addr: u64) -> &mut Self {
        // Report addresses are below 4 GiB by construction.
        self.emit(&[0x89, 0x04, 0x25])
            .emit(&(addr as u32).to_le_bytes())
    }
    /// `xor eax, eax`: 31 C0.
    pub fn xor_eax_eax(&mut self) -> &mut Self {
        self.emit(&[0x31, 0xc0])
    }
    /// `movzx eax, al`: 0F B6 C0.
    pub fn movzx_eax_al(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0xb6, 0xc0])
    }
    /// `mov al, imm8`: B0 ib.
    pub fn mov_al(&mut self, v: u8) -> &mut Self {
        self.emit(&[0xb0, v])
    }
    /// `mov eax, imm32`: B8 id (zero-extends into RAX in 64-bit mode).
    pub fn mov_eax(&mut self, v: u32) -> &mut Self {
        self.emit(&[0xb8]).emit(&v.to_le_bytes())
    }
    /// `mov ecx, imm32`: B9 id.
    pub fn mov_ecx(&mut self, v: u32) -> &mut Self {
        self.emit(&[0xb9]).emit(&v.to_le_bytes())
    }
    /// `xor ecx, ecx`: 31 C9.
    pub fn xor_ecx_ecx(&mut self) -> &mut Self {
        self.emit(&[0x31, 0xc9])
    }
    /// `mov eax, edx`: 89 D0 (MOV r/m32, r32 with ModRM 11 010 000).
    pub fn mov_eax_edx(&mut self) -> &mut Self {
        self.emit(&[0x89, 0xd0])
    }
    /// `mov eax, ecx`: 89 C8 (ModRM 11 001 000).
    pub fn mov_eax_ecx(&mut self) -> &mut Self {
        self.emit(&[0x89, 0xc8])
    }
    /// `or eax, imm32`: 0D id (zero-extends into RAX in 64-bit mode).
    pub fn or_eax(&mut self, v: u32) -> &mut Self {
        self.emit(&[0x0d]).emit(&v.to_le_bytes())
    }
    /// 64-bit: `bts rax, 63`: 48 0F BA /5 ib (ModRM 11 101 000 = E8).
    pub fn bts_rax_63(&mut self) -> &mut Self {
        self.emit(&[0x48, 0x0f, 0xba, 0xe8, 0x3f])
    }
    /// `mov ax, cs`: 66 8C C8 (MOV r/m16, Sreg with ModRM 11 001(cs) 000).
    pub fn mov_ax_cs(&mut self) -> &mut Self {
        self.emit(&[0x66, 0x8c, 0xc8])
    }
    /// `mov eax, cr0` (RAX in 64-bit mode): 0F 20 C0.
    pub fn mov_eax_cr0(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x20, 0xc0])
    }
    /// `mov cr0, eax` (RAX in 64-bit mode): 0F 22 C0.
    pub fn mov_cr0_eax(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x22, 0xc0])
    }
    /// `mov eax, cr3` (RAX in 64-bit mode): 0F 20 D8.
    pub fn mov_eax_cr3(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x20, 0xd8])
    }
    /// `mov cr3, eax` (RAX in 64-bit mode): 0F 22 D8.
    pub fn mov_cr3_eax(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x22, 0xd8])
    }
    /// `mov eax, cr4` (RAX in 64-bit mode): 0F 20 E0.
    pub fn mov_eax_cr4(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x20, 0xe0])
    }
    /// `mov cr4, eax` (RAX in 64-bit mode): 0F 22 E0.
    pub fn mov_cr4_eax(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x22, 0xe0])
    }
    /// `rdmsr`: 0F 32.
    pub fn rdmsr(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x32])
    }
    /// `wrmsr`: 0F 30.
    pub fn wrmsr(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x30])
    }
    /// `cpuid`: 0F A2.
    pub fn cpuid(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0xa2])
    }
    /// `rdtsc`: 0F 31.
    pub fn rdtsc(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x31])
    }
    /// `cli`: FA.
    pub fn cli(&mut self) -> &mut Self {
        self.emit(&[0xfa])
    }
    /// `hlt`: F4.
    pub fn hlt(&mut self) -> &mut Self {
        self.emit(&[0xf4])
    }
    /// `jmp $` (spin for ever): EB FE. Only the watchdog test uses it.
    pub fn spin(&mut self) -> &mut Self {
        self.emit(&[0xeb, 0xfe])
    }
    /// 64-bit: `pushfq`: 9C.
    pub fn pushf(&mut self) -> &mut Self {
        self.emit(&[0x9c])
    }
    /// 64-bit: `pop rax`: 58.
    pub fn pop_rax(&mut self) -> &mut Self {
        self.emit(&[0x58])
    }
    /// 64-bit: `push imm8` sign-extended to 64 bits: 6A ib.
    pub fn push_imm8(&mut self, v: u8) -> &mut Self {
        debug_assert!(v < 0x80, "push imm8 sign-extends");
        self.emit(&[0x6a, v])
    }
    /// 64-bit: `push imm32` sign-extended to 64 bits: 68 id (values < 2 GiB).
    pub fn push_imm32(&mut self, v: u32) -> &mut Self {
        debug_assert!(v < 0x8000_0000, "push imm32 sign-extends");
        self.emit(&[0x68]).emit(&v.to_le_bytes())
    }
    /// 64-bit: `iretq`: 48 CF (REX.W selects the 64-bit frame).
    pub fn iretq(&mut self) -> &mut Self {
        self.emit(&[0x48, 0xcf])
    }
    /// 64-bit: `mov rax, [rsp + d]`: 48 8B 44 24 ib (ModRM 01 000 100, SIB 00 100 100).
    /// In 32-bit mode use [`Asm::mov_eax_esp_disp8`].
    pub fn mov_rax_rsp_disp8(&mut self, d: u8) -> &mut Self {
        self.emit(&[0x48, 0x8b, 0x44, 0x24, d])
    }
    /// 32-bit: `mov eax, [esp + d]`: 8B 44 24 ib.
    pub fn mov_eax_esp_disp8(&mut self, d: u8) -> &mut Self {
        self.emit(&[0x8b, 0x44, 0x24, d])
    }
    /// `jmp rel32` to an absolute guest address: E9 cd (relative to the next instruction).
    pub fn jmp(&mut self, target: u64) -> &mut Self {
        let next = self.here() + 5;
        // Both addresses are below MEM_SIZE, so the difference fits in i32.
        let rel = (target as i64 - next as i64) as i32;
        self.emit(&[0xe9]).emit(&rel.to_le_bytes())
    }
    /// 32-bit: `ljmp sel:target` (far jump, ptr16:32): EA id iw.
    pub fn ljmp32(&mut self, selector: u16, target: u32) -> &mut Self {
        self.emit(&[0xea])
            .emit(&target.to_le_bytes())
            .emit(&selector.to_le_bytes())
    }
    /// `syscall`: 0F 05.
    pub fn syscall(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x05])
    }
    /// `sysenter`: 0F 34.
    pub fn sysenter(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x34])
    }
    /// `int3` (the one-byte breakpoint): CC.
    pub fn int3(&mut self) -> &mut Self {
        self.emit(&[0xcc])
    }
    /// `int1` (ICEBP): F1.
    pub fn int1(&mut self) -> &mut Self {
        self.emit(&[0xf1])
    }
    /// `int imm8`: CD ib.
    pub fn int(&mut self, v: u8) -> &mut Self {
        self.emit(&[0xcd, v])
    }
    /// `ud2`: 0F 0B.
    pub fn ud2(&mut self) -> &mut Self {
        self.emit(&[0x0f, 0x0b])
    }
    /// Raw bytes of a tested instruction given as a byte array.
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.emit(b)
    }

    // Composite sequences used by every probe.

    /// Reports a progress marker: `mov eax, s; mov [STAGE], eax`.
    pub fn stage(&mut self, s: u8) -> &mut Self {
        self.mov_eax(u32::from(s)).store_eax(report::STAGE)
    }
    /// Reports EAX as a value: `mov [VALUE], eax`.
    pub fn report_eax(&mut self) -> &mut Self {
        self.store_eax(report::VALUE)
    }
    /// Reports EDX:EAX as two values (EAX first); clobbers EAX.
    pub fn report_edx_eax(&mut self) -> &mut Self {
        self.report_eax().mov_eax_edx().report_eax()
    }
    /// Reports CS at `addr`: `xor eax, eax; mov ax, cs; mov [addr], eax`.
    pub fn report_cs(&mut self, addr: u64) -> &mut Self {
        self.xor_eax_eax().mov_ax_cs().store_eax(addr)
    }
    /// Ends the probe: `mov eax, code; mov [END], eax`, then `cli; hlt` in
    /// case the VMM resumed it anyway (at CPL3 those #GP, which a handler
    /// reports and halts on).
    pub fn end(&mut self, code: u32) -> &mut Self {
        self.mov_eax(code).store_eax(report::END).cli().hlt()
    }
}

/// One 64-bit IDT gate: present, DPL3, interrupt gate to `off` in the
/// 64-bit kernel code segment.
pub fn gate64(off: u64) -> [u8; 16] {
    let lo: u64 = (off & 0xffff)
        | (u64::from(sel::KERNEL_CS) << 16)
        | (0xeeu64 << 40) // P, DPL3, 64-bit interrupt gate
        | (((off >> 16) & 0xffff) << 48);
    let hi: u64 = off >> 32;
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&lo.to_le_bytes());
    g[8..].copy_from_slice(&hi.to_le_bytes());
    g
}

/// How a handler ends after reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerExit {
    /// `cli; hlt`: the run stops on the HLT exit.
    Halt,
    /// `iretq` back to the interrupted code (64-bit, only for vectors
    /// without an error code).
    Iretq,
}

/// Whether the CPU pushes an error code for exception `vector`.
pub fn has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10 | 11 | 12 | 13 | 14 | 17 | 21 | 29 | 30)
}

/// The 256 handler stubs at [`STUBS`]: stub `v` is `mov al, v; jmp common`
/// (same bytes in 32- and 64-bit mode).
pub fn stubs() -> Asm {
    let mut a = Asm::new(STUBS);
    for v in 0..=255u8 {
        a.mov_al(v).jmp(COMMON_HANDLER);
    }
    a
}

/// Address of the stub for `vector`.
pub fn stub_addr(vector: u8) -> u64 {
    STUBS + u64::from(vector) * STUB_LEN
}

/// The common handler at [`COMMON_HANDLER`] for 64-bit mode: reports the
/// vector (AL), its own CS, and three stack slots of the interrupt frame.
pub fn common_handler64(exit: HandlerExit) -> Asm {
    let mut a = Asm::new(COMMON_HANDLER);
    a.movzx_eax_al().store_eax(report::VECTOR);
    a.report_cs(report::HANDLER_CS);
    for d in [0u8, 8, 16] {
        a.mov_rax_rsp_disp8(d).store_eax(report::FRAME);
    }
    match exit {
        HandlerExit::Halt => a.cli().hlt(),
        HandlerExit::Iretq => a.iretq(),
    };
    a
}

/// The common handler for 32-bit protected mode (4-byte stack slots).
pub fn common_handler32() -> Asm {
    let mut a = Asm::new(COMMON_HANDLER);
    a.movzx_eax_al().store_eax(report::VECTOR);
    a.report_cs(report::HANDLER_CS);
    for d in [0u8, 4, 8] {
        a.mov_eax_esp_disp8(d).store_eax(report::FRAME);
    }
    a.cli().hlt();
    a
}

/// A GDT descriptor from its parts (the 64-bit mode ignores base/limit of
/// code and data, but the 32-bit probes use them: all flat 4 GiB).
fn seg_desc(access: u8, flags: u8) -> u64 {
    let limit: u64 = 0xfffff;
    (limit & 0xffff)
        | (u64::from(access) << 40)
        | (((limit >> 16) & 0xf) << 48)
        | (u64::from(flags & 0xf) << 52)
}

/// The GDT as bytes (see [`sel`]).
pub fn gdt() -> Vec<u8> {
    // access: P | DPL | S | type; flags: G | D/B | L.
    let entries: [u64; 8] = [
        0,
        seg_desc(0x9b, 0xc), // 0x08 kernel code32: P, DPL0, code RX accessed; G, D
        seg_desc(0x9b, 0xa), // 0x10 kernel code64: G, L
        seg_desc(0x93, 0xc), // 0x18 kernel data: RW accessed; G, B
        seg_desc(0xfb, 0xc), // 0x20 user code32: DPL3
        seg_desc(0xf3, 0xc), // 0x28 user data: DPL3
        seg_desc(0xfb, 0xa), // 0x30 user code64: DPL3, L
        0,
    ];
    let mut out = Vec::with_capacity(0x50);
    for e in entries {
        out.extend_from_slice(&e.to_le_bytes());
    }
    // 0x40: 64-bit TSS descriptor (16 bytes): limit 0x67, type 9 (available), P.
    let base = TSS;
    let lo: u64 =
        0x67 | ((base & 0xff_ffff) << 16) | (0x89u64 << 40) | (((base >> 24) & 0xff) << 56);
    let hi: u64 = base >> 32;
    out.extend_from_slice(&lo.to_le_bytes());
    out.extend_from_slice(&hi.to_le_bytes());
    out
}

/// A 64-bit IDT: 256 interrupt gates (type 0xE), DPL 3 so that `int n`
/// from user mode is allowed by the gate, selector [`sel::KERNEL_CS`],
/// IST 0, each pointing at its stub.
pub fn idt64() -> Vec<u8> {
    let mut out = Vec::with_capacity(4096);
    for v in 0..=255u8 {
        out.extend_from_slice(&gate64(stub_addr(v)));
    }
    out
}

/// A 32-bit IDT: 256 interrupt gates (type 0xE, 32-bit), selector
/// [`sel::KERNEL_CS32`].
pub fn idt32() -> Vec<u8> {
    let mut out = Vec::with_capacity(2048);
    for v in 0..=255u8 {
        let off = stub_addr(v);
        let e: u64 = (off & 0xffff)
            | (u64::from(sel::KERNEL_CS32) << 16)
            | (0xeeu64 << 40)
            | (((off >> 16) & 0xffff) << 48);
        out.extend_from_slice(&e.to_le_bytes());
    }
    out
}

/// The 64-bit TSS: only RSP0 matters (the stack a CPL3→CPL0 entry switches to).
pub fn tss64() -> Vec<u8> {
    let mut out = vec![0u8; 0x68];
    out[4..12].copy_from_slice(&KERNEL_STACK_TOP.to_le_bytes());
    // I/O map base beyond the limit: no I/O bitmap (IOPL decides).
    out[0x66..0x68].copy_from_slice(&0x68u16.to_le_bytes());
    out
}

/// Page-table pages as (GPA, 8-byte entries at index 0): identity map of
/// the first 2 MiB, user-accessible and writable at every level, so code
/// and stacks work at CPL0 and CPL3 alike (no SMEP/SMAP is enabled).
pub fn page_tables() -> Vec<(u64, u64)> {
    let flags = pte::PRESENT | pte::WRITABLE | pte::USER;
    vec![
        (PML4, PDPT | flags),
        (PDPT, PD | flags),
        (PD, flags | pte::HUGE),
        // PAE PDPTEs allow only P (and cache bits): RW/US are reserved there.
        (PAE_PDPT, PD | pte::PRESENT),
        // Legacy 32-bit paging with CR4.PSE: one 4 MiB page at 0.
        (LEGACY_PD, flags | pte::HUGE),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jmp_is_relative_to_next_instruction() {
        let mut a = Asm::new(0x1000);
        a.jmp(0x1000);
        // E9 then -5: jumps back onto itself.
        assert_eq!(a.bytes(), &[0xe9, 0xfb, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn stubs_have_fixed_stride_and_reach_common_handler() {
        let s = stubs();
        assert_eq!(s.bytes().len() as u64, 256 * STUB_LEN);
        for v in [0u8, 3, 0x80, 255] {
            let off = (stub_addr(v) - STUBS) as usize;
            let b = &s.bytes()[off..off + STUB_LEN as usize];
            assert_eq!(&b[..2], &[0xb0, v]);
            let rel = i32::from_le_bytes([b[3], b[4], b[5], b[6]]);
            let next = stub_addr(v) + STUB_LEN;
            assert_eq!((next as i64 + i64::from(rel)) as u64, COMMON_HANDLER);
        }
    }

    #[test]
    fn gdt_matches_linux_selectors() {
        let g = gdt();
        assert_eq!(g.len(), usize::from(GDT_LIMIT) + 1);
        let desc = |s: u16| {
            let i = usize::from(s & !7);
            u64::from_le_bytes(g[i..i + 8].try_into().unwrap_or([0; 8]))
        };
        // L bit (53) on the 64-bit code segments only.
        assert_ne!(desc(sel::KERNEL_CS) & (1 << 53), 0);
        assert_ne!(desc(sel::USER_CS) & (1 << 53), 0);
        assert_eq!(desc(sel::KERNEL_CS32) & (1 << 53), 0);
        // DPL (bits 45..47) 3 on user segments.
        assert_eq!((desc(sel::USER_CS) >> 45) & 3, 3);
        assert_eq!((desc(sel::USER_DS) >> 45) & 3, 3);
        assert_eq!((desc(sel::KERNEL_CS) >> 45) & 3, 0);
        // SYSRET's layout: user CS = STAR base + 16, SS = base + 8.
        assert_eq!(sel::USER_CS32 + 16, sel::USER_CS);
        assert_eq!(sel::USER_CS32 + 8, sel::USER_DS);
        assert_eq!(sel::KERNEL_CS + 8, sel::KERNEL_DS);
    }

    #[test]
    fn code_regions_fit_their_slots() {
        assert!(
            COMMON_HANDLER + common_handler64(HandlerExit::Halt).bytes().len() as u64
                <= KERNEL_CODE
        );
        assert!(COMMON_HANDLER + common_handler32().bytes().len() as u64 <= KERNEL_CODE);
        assert_eq!(idt64().len(), 4096);
    }
}
