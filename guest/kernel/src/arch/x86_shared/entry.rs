//! What the two flavours' entry areas (`arch/*/entry.rs`) share, written
//! once as GAS macros whose parameters are the flavour's register names, as
//! Linux shares `pti.c` between x86_32 and x86_64. The flavour supplies,
//! before it splices these in:
//! * `COUNT ctr`: the 64-bit increment of counter `ctr` in this CPU's block
//!   (x86_64: `incq %gs:ctr`; x86_32: `addl $1, %fs:ctr; adcl $0, %fs:ctr+4`);
//! * the `CTR_*` counter offsets and `PTI_SWITCH_MASK` (the CR3 bits an
//!   entry clears: bit 12, the user copy, and on x86_64 bit 11, the user PCID).
//!
//! The macros assemble exactly the instructions each flavour had when they
//! were written twice (the per-call instruction counts are those of
//! docs/guest.md); each flavour's asm block purges them at its end
//! (`entry_purge!`).

/// The shared entry macros:
/// * `ENTRY_DATA idt_quads, gdt_quads`: the start of `.entry.data`, CPU 0's
///   part of the entry area: IDT, GDT, TSS, the PCID flag and the 2 KiB
///   entry stack (`entry_stack_top`; x86_64 puts its IST stacks after it);
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
/// * `EXCEPTION_STUBS word, align`: the table of the 32 stub addresses
///   (`.long` or `.quad`) and CPU 0's 16 KiB fault stack (APs get theirs
///   from the frame allocator).
macro_rules! entry_macros {
    () => {
        r#"
    .macro ENTRY_DATA idt_quads, gdt_quads
    .section .entry.data, "aw"
    .balign 4096
    .global entry_idt
entry_idt:
    .fill \idt_quads, 8, 0
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

    .macro EXCEPTION_STUBS word, align
    .section .rodata.exception_stubs, "a"
    .balign \align
    .global exception_stubs
exception_stubs:
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    \word exc_\n
    .endr

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
    .purgem EXCEPTION_STUBS
    .purgem COUNT
"#
    };
}
pub(crate) use entry_purge;
