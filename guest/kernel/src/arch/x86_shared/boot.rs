//! What both flavours' PVH entries (`arch/*/boot.rs`) share, as GAS macros
//! spliced into each flavour's boot asm block (which purges them at its
//! end):
//! * `PVH_ENTRY`: the `XEN_ELFNOTE_PHYS32_ENTRY` note naming `pvh_start32`,
//!   and the start of `pvh_start32` itself in `.boot.text` (32-bit protected
//!   mode, paging off, interrupts off, `ebx` = GPA of `hvm_start_info`, kept
//!   in `esi` for `kmain`); the flavour goes on to its paging mode;
//! * `BOOT_STACK`: the 16 KiB boot stack (`boot_stack_top`) `kmain` runs on.
//!
//! `boot_asm!(body)` is the flavour's whole boot asm block: `PVH_ENTRY`,
//! then `body` (the way to its paging mode, the boot tables, and the
//! high-half start code up to `kmain`'s stack and argument), then the
//! shared `call kmain`, the boot stack and the purges.

/// The shared boot macros (see the module doc).
macro_rules! boot_macros {
    () => {
        r#"
    .macro PVH_ENTRY
    .section .note.Xen, "a"
    .balign 4
    .long 4                 /* namesz: "Xen\0" */
    .long 4                 /* descsz */
    .long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .balign 4
    .long pvh_start32

    .section .boot.text, "ax"
    .code32
    .global pvh_start32
pvh_start32:
    cli
    cld
    movl %ebx, %esi                 /* start_info GPA, kmain's argument */
    .endm

    .macro BOOT_STACK
    .section .bss.boot_stack, "aw", @nobits
    .balign 16
boot_stack:
    .skip 16384
boot_stack_top:
    .previous
    .endm
"#
    };
}
pub(crate) use boot_macros;

/// The boot asm block of a flavour (see the module doc).
macro_rules! boot_asm {
    ($body:expr $(,)?) => {
        core::arch::global_asm!(
            $crate::arch::x86_shared::boot::boot_macros!(),
            "    PVH_ENTRY",
            $body,
            r#"    call kmain
    ud2

    BOOT_STACK
    .purgem PVH_ENTRY
    .purgem BOOT_STACK
"#,
            options(att_syntax)
        );
    };
}
pub(crate) use boot_asm;
