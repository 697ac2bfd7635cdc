//! PVH entry: 32-bit protected mode, paging off, `ebx` = GPA of
//! `hvm_start_info`. Builds nothing at run time: the boot page tables are
//! emitted statically (identity map and higher-half map of the first GiB with
//! 2 MiB pages), so entering long mode takes a few dozen instructions, which
//! matters where kernel code is emulated.

crate::arch::x86_shared::boot::boot_asm!(
    r#"
    movl $0x80000001, %eax
    cpuid
    movl %edx, %edi                 /* extended features: NX is bit 20 */
    movl $boot_pml4, %eax
    movl %eax, %cr3                 /* counted later as Cr3Other (telemetry::init) */
    movl %cr4, %eax
    orl $0x20, %eax                 /* PAE */
    movl %eax, %cr4
    movl $0xc0000080, %ecx          /* EFER */
    rdmsr
    orl $0x100, %eax                /* LME */
    btl $20, %edi
    jnc 1f
    orl $0x800, %eax                /* NXE, if the CPU has NX */
1:  wrmsr
    movl %cr0, %eax
    orl $0x80010001, %eax           /* PG | WP | PE */
    movl %eax, %cr0
    lgdt boot_gdt_ptr
    ljmp $0x08, $boot_long

    .code64
boot_long:
    movabsq $start64_high, %rax
    jmp *%rax

    .section .boot.data, "aw"
    /* 8 KiB aligned: CR3 bit 12 means "user copy loaded" to the exception
     * entry code, so no kernel page-table root may have it set. */
    .balign 8192
    .global boot_pml4
boot_pml4:
    .quad boot_pdpt_low + 0x3
    .fill 510, 8, 0
    .quad boot_pdpt_high + 0x3
boot_pdpt_low:
    .quad boot_pd + 0x3
    .fill 511, 8, 0
boot_pdpt_high:
    .fill 510, 8, 0
    .quad boot_pd + 0x3             /* KERNEL_BASE: PML4 511, PDPT 510 */
    .quad boot_pd_tel + 0x3         /* TELEMETRY_VA: PDPT 511, PD 0, PT 0 */
boot_pd_tel:
    .quad boot_pt_tel + 0x3
    .fill 511, 8, 0
boot_pt_tel:
    .quad boot_telemetry_page + 0x3
    .fill 511, 8, 0
    /* The telemetry page used until the kernel maps the VMM's (and for good
     * when the command line names none, e.g. under QEMU): counters work from
     * the first instruction of kmain. */
    .global boot_telemetry_page
boot_telemetry_page:
    .fill 512, 8, 0
boot_pd:
    .set i, 0
    .rept 512
    .quad (i << 21) | 0x83          /* present, writable, 2 MiB */
    .set i, i + 1
    .endr
boot_gdt:
    .quad 0
    .quad 0x00af9a000000ffff        /* 0x08: 64-bit code */
    .quad 0x00cf92000000ffff        /* 0x10: data */
boot_gdt_end:
    .balign 4
    .word 0
boot_gdt_ptr:
    .word boot_gdt_end - boot_gdt - 1
    .long boot_gdt

    .section .text.start64, "ax"
    .code64
start64_high:
    movl $0x10, %eax
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    movq $boot_stack_top, %rsp
    xorl %ebp, %ebp
    movl %esi, %edi                 /* zero-extends the start_info GPA */
"#,
);
