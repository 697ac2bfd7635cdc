//! PVH entry of the 32-bit flavour: 32-bit protected mode, paging off,
//! `ebx` = GPA of `hvm_start_info`. The boot page tables are static: one
//! PMD mapping the first 768 MiB with 2 MiB pages, used both as the identity
//! map (PDPT slot 0, for the few instructions after CR0.PG) and as the
//! kernel GiB (slot 3), plus `TELEMETRY_VA` → a zero page of the image.
//! Enabling PAE paging takes a few dozen instructions and no loops.

crate::arch::x86_shared::boot::boot_asm!(
    r#"
    xorl %edi, %edi
    movl $0x80000000, %eax
    cpuid
    cmpl $0x80000001, %eax
    jb 1f
    movl $0x80000001, %eax
    cpuid
    movl %edx, %edi                 /* extended features: NX is bit 20 */
1:  movl $boot_pdpt, %eax
    movl %eax, %cr3                 /* counted later as Cr3Other (paging::setup_kernel_tables) */
    movl %cr4, %eax
    /* PAE, and PGE now rather than later: a CR4.PGE write with paging on
     * makes KVM reload the PDPTEs (load_pdptrs), and under kvm_amd nested
     * in QEMU TCG the PDPTE it reads back has bit 5 (accessed, reserved in
     * a PDPTE) set by QEMU's nested page walker: a #GP. Set before CR0.PG,
     * no later CR4 write changes a PDPTR bit (load_kernel_root's and
     * ap_setup's write the same PGE). */
    orl $0xa0, %eax                 /* PAE | PGE */
    movl %eax, %cr4
    btl $20, %edi
    jnc 2f
    movl $0xc0000080, %ecx          /* EFER.NXE, if the CPU has NX */
    rdmsr
    orl $0x800, %eax
    wrmsr
2:  movl %cr0, %eax
    orl $0x80010001, %eax           /* PG | WP | PE: loads the PDPTEs */
    movl %eax, %cr0
    movl $start32_high, %eax
    jmp *%eax

    .section .boot.data, "aw"
    /* 8 KiB aligned: CR3 bit 12 means "user copy loaded" to the exception
     * entry code, so no kernel page-table root may have it set. */
    .balign 8192
    .global boot_pdpt
boot_pdpt:
    .long boot_pmd + 1, 0           /* PDPTEs: present only */
    .long 0, 0
    .long 0, 0
    .long boot_pmd + 1, 0           /* KERNEL_BASE = 3 GiB */
    .balign 4096
boot_pmd:
    .set i, 0
    .rept 384
    .long (i << 21) | 0x83, 0       /* present, writable, 2 MiB */
    .set i, i + 1
    .endr
    .long boot_pt_tel + 3, 0        /* TELEMETRY_VA: PMD 384 */
    .fill 127, 8, 0
boot_pt_tel:
    .long boot_telemetry_page + 3, 0
    .fill 511, 8, 0
    /* The telemetry page used until the kernel maps the VMM's (and for good
     * when the command line names none, e.g. under QEMU). */
    .global boot_telemetry_page
boot_telemetry_page:
    .fill 512, 8, 0

    .section .text.start32, "ax"
start32_high:
    movl $boot_stack_top, %esp
    xorl %ebp, %ebp
    subl $12, %esp                  /* 16-byte aligned at the call */
    pushl %esi
"#,
);
