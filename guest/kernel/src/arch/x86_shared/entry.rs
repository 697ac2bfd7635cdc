//! What the two flavours' entry areas (`arch/*/entry.rs`) share, written
//! once as GAS macros whose parameters are the flavour's register names, as
//! Linux shares `pti.c` between x86_32 and x86_64. Each flavour's entry
//! area is one `entry_asm!` block, which sets the shared `CTR_*` counter
//! offsets and `PCPU_*` words, splices these macros in and purges them at
//! its end (`entry_purge!`); the flavour's part of the block supplies:
//! * `EXC_GATE n, lo16, hi16`: exception `n`'s IDT gate, its handler's
//!   address given as its low 16 bits and the next 16 (x86_64: the top 32
//!   bits are the linker script's `__idt_hi32`), with `n`'s IST slot;
//! * `COUNT ctr`: the 64-bit increment of counter `ctr` in this CPU's block
//!   (x86_64: `incq %gs:ctr`; x86_32: `addl $1, %fs:ctr; adcl $0, %fs:ctr+4`);
//! * `PTI_SWITCH_MASK` (the CR3 bits an entry clears: bit 12, the user copy,
//!   and on x86_64 bit 11, the user PCID) and its own symbols and stubs.
//!
//! The macros assemble exactly the instructions each flavour had when they
//! were written twice (the per-call instruction counts are those of
//! docs/guest.md).

/// The shared entry macros:
/// * `ENTRY_DATA idt_quads, gdt_quads, gate_quads`: the start of
///   `.entry.data`, CPU 0's part of the entry area: IDT (its 32 exception
///   gates, of `gate_quads` quadwords each, written at link time by the
///   flavour's `EXC_GATE` from the address pieces the linker script
///   defines: no set-up loop at boot), GDT, TSS, the PCID flag and the
///   2 KiB entry stack (`entry_stack_top`; x86_64 puts its IST stacks
///   after it);
/// * `ENTRY_CPU_AREAS bytes`: CPUs 1..7's parts of the entry area, one page
///   each (`descriptors::ApArea`: GDT, TSS, entry stack, on x86_64 the IST
///   stacks), like Linux's per-CPU `cpu_entry_area`; mapped in the user copy
///   with the rest of the entry area;
/// * `SWITCH_TO_KERNEL_CR3_NOPCID scratch` / `SWITCH_TO_USER_CR3_NOPCID
///   scratch` (Linux: `SWITCH_TO_KERNEL_CR3`, `SWITCH_TO_USER_CR3_NOSTACK`
///   without PCID): the counted, flushing CR3 switches, counters on the
///   kernel copy (after the entry write, before the exit write: the user
///   copy does not map them);
/// * `EXC_NOERR n` / `EXC_ERR n`: exception stub `exc_n` (a zero error code
///   pushed where the CPU pushes none, then the vector; the push width is the
///   mode's), jumping to the flavour's `exc_common`;
/// * `ENTRY_TEXT bits`: `.entry.text` in `.code<bits>`, starting with the
///   32 exception stubs (the vectors' error-code kind is architectural);
/// * `ENTRY_NMI ax, cx, iret`: the paranoid NMI stub `entry_nmi` on the
///   current stack (x86_64: its IST stack). It may arrive anywhere, even
///   between a CR3 switch and the stack switch, so it saves CR3, runs on the
///   kernel copy if the user copy was loaded and restores CR3 before
///   returning (Linux: `SAVE_AND_SWITCH_TO_KERNEL_CR3`, `RESTORE_CR3`); both
///   writes are counted as "other" while the counters are still mapped;
/// * `FAULT_STACK`: CPU 0's 16 KiB fault stack (APs get theirs from the
///   frame allocator).
macro_rules! entry_macros {
    () => {
        r#"
    .macro ENTRY_DATA idt_quads, gdt_quads, gate_quads
    .section .entry.data, "aw"
    .balign 4096
    .global entry_idt
entry_idt:
    /* The 32 exception gates, written at link time by the flavour's
     * EXC_GATE from pieces of the handlers' addresses that the linker
     * script computes: a stub's is the start of the entry text (where
     * ENTRY_TEXT puts exc_0) plus its offset there, NMI's is entry_nmi's.
     * The other gates are set at run time (descriptors::set_gate). */
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .if \n == 2
    EXC_GATE \n, __idt_nmi_lo16, __idt_nmi_hi16
    .else
    EXC_GATE \n, __idt_stubs_lo16 + (exc_\n - exc_0), __idt_stubs_hi16
    .endif
    .endr
    .fill \idt_quads - 32 * \gate_quads, 8, 0
    .global entry_gdt
entry_gdt:
    .fill \gdt_quads, 8, 0
    .balign 16
    .global entry_tss
entry_tss:
    .fill 104, 1, 0
    .balign 8
    /* 1 while PCID is in use (CR4.PCIDE): entry code sets NOFLUSH. Never
     * set on x86_32 (no PCID); the shared task code reads it. */
    .global entry_pcid_on
entry_pcid_on:
    .quad 0
    .balign 4096
    .global entry_stack
entry_stack:
    .skip 2048
    .global entry_stack_top
entry_stack_top:
    .endm

    .macro ENTRY_CPU_AREAS bytes
    .section .entry.data.cpu_areas, "aw"
    .balign 4096
    .global entry_cpu_areas
entry_cpu_areas:
    .fill \bytes, 1, 0
    .previous
    .endm

    .macro SWITCH_TO_KERNEL_CR3_NOPCID scratch
    mov %cr3, \scratch
    and $~0x1000, \scratch
    mov \scratch, %cr3
    COUNT CTR_CR3_ENTRY
    COUNT CTR_TLB_FLUSH
    .endm

    .macro SWITCH_TO_USER_CR3_NOPCID scratch
    COUNT CTR_CR3_EXIT
    COUNT CTR_TLB_FLUSH
    mov %cr3, \scratch
    or $0x1000, \scratch
    mov \scratch, %cr3
    .endm

    .macro EXC_NOERR n
    .balign 16
exc_\n:
    push $0
    push $\n
    jmp exc_common
    .endm

    .macro EXC_ERR n
    .balign 16
exc_\n:
    push $\n
    jmp exc_common
    .endm

    .macro ENTRY_NMI ax, cx, iret
    .balign 16
    .global entry_nmi
entry_nmi:
    push \ax
    push \cx
    mov %cr3, \ax
    bt $12, \ax
    jnc 1f
    mov \ax, \cx
    and $~PTI_SWITCH_MASK, \cx
    mov \cx, %cr3
    COUNT CTR_INTERRUPTS
    COUNT CTR_CR3_OTHER
    COUNT CTR_TLB_FLUSH
    COUNT CTR_CR3_OTHER
    COUNT CTR_TLB_FLUSH
    mov \ax, %cr3
    jmp 2f
1:  COUNT CTR_INTERRUPTS
2:  pop \cx
    pop \ax
    \iret
    .endm

    /* The start of `.entry.text` and the 32 exception stubs (`exc_0` ..
     * `exc_31`): EXC_ERR where the CPU pushes an error code (vectors 8,
     * 10-14, 17, 21, 29, 30: the set bits of 0x60227d00), EXC_NOERR
     * elsewhere. */
    .macro ENTRY_TEXT bits
    .section .entry.text, "ax"
    .code\bits
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .if (0x60227d00 >> \n) & 1
    EXC_ERR \n
    .else
    EXC_NOERR \n
    .endif
    .endr
    .endm

    .macro FAULT_STACK
    .section .bss.fault_stack, "aw", @nobits
    .balign 16
    .skip 16384
    .global fault_stack_top
fault_stack_top:
    .previous
    .endm
"#
    };
}
pub(crate) use entry_macros;

/// Purges the macros of [`entry_macros!`] (and the flavour's `COUNT`) at
/// the end of the asm block that spliced them in.
macro_rules! entry_purge {
    () => {
        r#"
    .purgem ENTRY_DATA
    .purgem ENTRY_CPU_AREAS
    .purgem SWITCH_TO_KERNEL_CR3_NOPCID
    .purgem SWITCH_TO_USER_CR3_NOPCID
    .purgem EXC_NOERR
    .purgem EXC_ERR
    .purgem ENTRY_TEXT
    .purgem ENTRY_NMI
    .purgem FAULT_STACK
    .purgem EXC_GATE
    .purgem COUNT
"#
    };
}
pub(crate) use entry_purge;

/// `entry_asm!(bodies…; extra operands)`: a flavour's entry asm block. Sets
/// the counter offsets (`CTR_*`), the syscall table bounds and the per-CPU
/// words both flavours' stubs read (`PCPU_*`, `PCPU_KERNEL + offset`), splices
/// in [`entry_macros!`], then the flavour's `bodies` (its `COUNT`,
/// `PTI_SWITCH_MASK`, own symbols and the stubs), then [`entry_purge!`]. The
/// `extra operands` are the ones only the flavour names, each followed by a
/// comma; `cpu_areas` is the size of `entry_cpu_areas`.
macro_rules! entry_asm {
    ($($body:expr),+ $(,)?; $($extra:tt)*) => {
        core::arch::global_asm!(
            r#"
    .set CTR_CR3_ENTRY, {c_entry}
    .set CTR_CR3_EXIT, {c_exit}
    .set CTR_CR3_OTHER, {c_other}
    .set CTR_TLB_FLUSH, {c_flush}
    .set CTR_SYSCALLS, {c_syscalls}
    .set CTR_EXCEPTIONS, {c_exceptions}
    .set CTR_INTERRUPTS, {c_interrupts}
    .set TABLE_SIZE, {table_size}
    .set ENOSYS, {enosys}
    .set PCPU_KSTACK_TOP, PCPU_KERNEL + {p_kstack}
    .set PCPU_EXIT_PTI, PCPU_KERNEL + {p_exit_pti}
    .set PCPU_ENTRY_FRAME, PCPU_KERNEL + {p_entry_frame}
    .set PCPU_FAULT_STACK_TOP, PCPU_KERNEL + {p_fault}
"#,
            $crate::arch::x86_shared::entry::entry_macros!(),
            $($body,)+
            $crate::arch::x86_shared::entry::entry_purge!(),
            c_entry = const ptiscope_abi::telemetry::Counter::Cr3Entry.offset_in_block(),
            c_exit = const ptiscope_abi::telemetry::Counter::Cr3Exit.offset_in_block(),
            c_other = const ptiscope_abi::telemetry::Counter::Cr3Other.offset_in_block(),
            c_flush = const ptiscope_abi::telemetry::Counter::TlbFlushFull.offset_in_block(),
            c_syscalls = const ptiscope_abi::telemetry::Counter::Syscalls.offset_in_block(),
            c_exceptions = const ptiscope_abi::telemetry::Counter::Exceptions.offset_in_block(),
            c_interrupts = const ptiscope_abi::telemetry::Counter::Interrupts.offset_in_block(),
            table_size = const ptiscope_abi::syscall::TABLE_SIZE,
            enosys = const ptiscope_abi::syscall::ENOSYS,
            cpu_areas = const (ptiscope_abi::telemetry::MAX_CPUS - 1) * 4096,
            p_kstack = const super::percpu::kernel::KSTACK_TOP,
            p_exit_pti = const super::percpu::kernel::EXIT_PTI,
            p_entry_frame = const super::percpu::kernel::ENTRY_FRAME,
            p_fault = const super::percpu::kernel::FAULT_STACK_TOP,
            $($extra)*
            options(att_syntax)
        );
    };
}
pub(crate) use entry_asm;
