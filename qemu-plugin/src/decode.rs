//! Which instructions the plugin must see, decoded from their bytes.
//!
//! QEMU hands the plugin one instruction at a time (its bytes and size), so
//! a decode never runs into the next instruction: in 32-bit code a `0x48`
//! (DEC EAX) is an instruction of its own and never read as a REX prefix of
//! the one after it.

/// An instruction the plugin counts or snapshots at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// MOV CR3, reg (`0F 22 /3`).
    Cr3Write,
    /// INVLPG m (`0F 01 /7`, memory operand).
    Invlpg,
    /// INVPCID r, m128 (`66 0F 38 82`).
    Invpcid,
    /// SYSCALL (`0F 05`).
    Syscall,
    /// SYSENTER (`0F 34`).
    Sysenter,
    /// A software interrupt: INT imm8 (`CD ib`), INT3 (`CC`), INTO (`CE`).
    IntN,
    /// SYSRET (`0F 07`, with or without REX.W).
    Sysret,
    /// SYSEXIT (`0F 35`, with or without REX.W).
    Sysexit,
    /// IRET/IRETD/IRETQ (`CF`, with or without an operand-size prefix).
    Iret,
    /// OUT DX, EAX (`EF` without the 0x66 prefix): the phase-marker write.
    Out32,
    /// `mov dword ptr [edi], eax` (`89 07`; `[rdi]` in 64-bit code) right
    /// after `mov edx, PORT` in user mode, with `umark=PORT`: the Linux
    /// init's phase-marker store to its MMIO marker page. Never returned by
    /// [`classify`] (an ordinary store elsewhere is not counted); the
    /// plugin makes it one from the pair ([`is_mark_store`]).
    MarkStore,
    /// VERW m16/r16 (`0F 00 /5`): Linux's CPU-buffer clearing (MDS, TAA,
    /// MMIO stale data, RFDS).
    Verw,
    /// LFENCE (`0F AE /5`, register form `E8`..`EF`): speculation barriers.
    Lfence,
    /// WRMSR (`0F 30`): SPEC_CTRL (IBRS), PRED_CMD (IBPB), FLUSH_CMD (L1D).
    Wrmsr,
    /// VMRUN (`0F 01 D8`), with `svm=1`: the host (a KVM under QEMU's
    /// SVM) enters its guest. Never returned by [`classify`] and never
    /// counted: the plugin follows guest mode with it ([`is_vmrun`]).
    Vmrun,
}

/// Whether `bytes` is VMRUN (`0F 01 D8`; an address-size prefix makes it
/// `vmrun eax`).
pub fn is_vmrun(bytes: &[u8]) -> bool {
    let Prefixes { len, .. } = prefixes(bytes);
    bytes[len..] == [0x0f, 0x01, 0xd8]
}

/// Legacy prefixes (lock/rep, segment overrides, operand and address size).
fn is_legacy_prefix(b: u8) -> bool {
    matches!(
        b,
        0xf0 | 0xf2 | 0xf3 | 0x2e | 0x36 | 0x3e | 0x26 | 0x64 | 0x65 | 0x66 | 0x67
    )
}

/// Whether `bytes` is exactly `mov edx, imm32` with `imm32 == port`
/// (`BA` + little-endian imm32, no prefix: the same in 32- and 64-bit code).
pub fn is_mov_edx_imm(bytes: &[u8], port: u32) -> bool {
    matches!(bytes, [0xba, a, b, c, d] if u32::from_le_bytes([*a, *b, *c, *d]) == port)
}

/// The immediate of `mov ecx, imm32` (`B9` + little-endian imm32, no
/// prefix): the MSR number Linux loads before a WRMSR (API version 1
/// cannot read registers, so a WRMSR's MSR is read from the instruction
/// bytes before it).
pub fn mov_ecx_imm(bytes: &[u8]) -> Option<u32> {
    match bytes {
        [0xb9, a, b, c, d] => Some(u32::from_le_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// Whether `bytes` (not `mov ecx, imm32`) may write ECX, so that a WRMSR
/// after it no longer uses the MSR number an earlier `mov ecx, imm32`
/// loaded. Conservative: any instruction whose ModRM names ECX as a
/// destination register is not decoded here, so only instructions that
/// are known to leave ECX alone keep the number (see [`keeps_ecx`]).
pub fn keeps_ecx(bytes: &[u8]) -> bool {
    // A REX.B/REX.R makes a register operand r9, not ecx, but is kept
    // conservative: decided by opcode.
    let Prefixes { len, rex, .. } = prefixes(bytes);
    let op = &bytes[len..];
    // The destination register of a ModRM form with mod == 3: rm field,
    // extended by REX.B; of `op r, r/m`: reg field, extended by REX.R.
    let rm_is_ecx = |m: u8| m >> 6 == 3 && m & 7 == 1 && rex & 0x01 == 0;
    let reg_is_ecx = |m: u8| (m >> 3) & 7 == 1 && rex & 0x04 == 0;
    match op {
        // mov r32, imm32 into another register (B8+r), except B9 (ecx).
        [0xb8 | 0xba..=0xbf, ..] => true,
        // mov r/m, r (89) and ALU r/m, r (01/09/21/29/31...): writes rm.
        [0x89 | 0x01 | 0x09 | 0x21 | 0x29 | 0x31 | 0x11 | 0x19, m, ..] => !rm_is_ecx(*m),
        // mov r, r/m (8B) and ALU r, r/m: writes reg.
        [0x8b | 0x03 | 0x0b | 0x23 | 0x2b | 0x33 | 0x13 | 0x1b, m, ..] => !reg_is_ecx(*m),
        // shr/shl r/m, imm8 (C1 /x): writes rm.
        [0xc1, m, ..] => !rm_is_ecx(*m),
        // movq/mov from memory with a segment (65 48 8B ...) is covered
        // above; push/pop/nop/lea into other registers are common too.
        [0x50..=0x57 | 0x90, ..] => true,
        [0x58..=0x5f, ..] => op[0] != 0x59 || rex & 0x01 != 0,
        [0x8d, m, ..] => !reg_is_ecx(*m),
        _ => false,
    }
}

/// Whether `bytes` is exactly `mov dword ptr [edi], eax` (`89 07`, the
/// same bytes for `[rdi]` in 64-bit code): the store of the Linux init's
/// MMIO phase marker, which follows its `mov edx, PORT`.
pub fn is_mark_store(bytes: &[u8]) -> bool {
    bytes == [0x89, 0x07]
}

/// Whether `bytes` is a string instruction with a REP/REPE/REPNE prefix
/// (`F3`/`F2` before MOVS, CMPS, STOS, LODS, SCAS, INS or OUTS): the
/// instructions that TCG executes one iteration at a time, jumping back to
/// the same instruction (a new block starting at it) for the next one.
/// `rep ret`, `pause` (`F3 90`) and the like are not looped and are not it.
pub fn is_rep_string(bytes: &[u8]) -> bool {
    let mut rep = false;
    let mut i = 0;
    while i < bytes.len() && i < 15 {
        let b = bytes[i];
        if b == 0xf3 || b == 0xf2 {
            rep = true;
        } else if !(is_legacy_prefix(b) || ((0x40..=0x4f).contains(&b) && i + 1 < bytes.len())) {
            break;
        }
        i += 1;
    }
    rep && matches!(bytes.get(i), Some(0xa4..=0xa7 | 0xaa..=0xaf | 0x6c..=0x6f))
}

/// An instruction's prefixes: how many bytes they take, the REX byte in
/// force (0 if none) and whether the operand-size prefix 0x66 is there.
struct Prefixes {
    len: usize,
    rex: u8,
    opsize: bool,
}

/// Reads the legacy and REX prefixes at the start of `bytes`.
fn prefixes(bytes: &[u8]) -> Prefixes {
    let mut p = Prefixes {
        len: 0,
        rex: 0,
        opsize: false,
    };
    // At most 15 bytes make an instruction; prefixes can repeat.
    while p.len < bytes.len() && p.len < 15 {
        let b = bytes[p.len];
        if is_legacy_prefix(b) {
            p.opsize |= b == 0x66;
            // A legacy prefix after a REX cancels it.
            p.rex = 0;
            p.len += 1;
        } else if (0x40..=0x4f).contains(&b) && p.len + 1 < bytes.len() {
            // A REX prefix only when something follows it: a lone 0x4X is
            // INC/DEC in 32-bit code.
            p.rex = b;
            p.len += 1;
        } else {
            break;
        }
    }
    p
}

/// The kind of one instruction (`bytes` is exactly that instruction), or
/// `None` if the plugin does not look at it.
pub fn classify(bytes: &[u8]) -> Option<Kind> {
    let Prefixes { len, rex, opsize } = prefixes(bytes);
    let op = &bytes[len..];
    let modrm_reg = |m: u8| (m >> 3) & 7;
    match op {
        [0xcd, _, ..] | [0xcc, ..] | [0xce, ..] => Some(Kind::IntN),
        [0xcf, ..] => Some(Kind::Iret),
        [0xef, ..] if !opsize => Some(Kind::Out32),
        // MOV CR, reg: reg field 3 is CR3 (REX.R would make it CR11, which
        // does not exist and faults).
        [0x0f, 0x22, m, ..] if modrm_reg(*m) == 3 && rex & 0x04 == 0 => Some(Kind::Cr3Write),
        // 0F 01 /7 with a memory operand; mod == 3 is SWAPGS/RDTSCP.
        [0x0f, 0x01, m, ..] if modrm_reg(*m) == 7 && *m >> 6 != 3 => Some(Kind::Invlpg),
        [0x0f, 0x38, 0x82, m, ..] if opsize && *m >> 6 != 3 => Some(Kind::Invpcid),
        [0x0f, 0x05, ..] => Some(Kind::Syscall),
        [0x0f, 0x34, ..] => Some(Kind::Sysenter),
        [0x0f, 0x07, ..] => Some(Kind::Sysret),
        [0x0f, 0x35, ..] => Some(Kind::Sysexit),
        // 0F 00 /5: VERW (register or memory operand).
        [0x0f, 0x00, m, ..] if modrm_reg(*m) == 5 => Some(Kind::Verw),
        // 0F AE /5 with mod == 3 (E8..EF): LFENCE; with a memory operand it
        // is XRSTOR.
        [0x0f, 0xae, 0xe8..=0xef, ..] => Some(Kind::Lfence),
        [0x0f, 0x30, ..] => Some(Kind::Wrmsr),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmrun_is_known_by_its_bytes() {
        assert!(is_vmrun(&[0x0f, 0x01, 0xd8]));
        assert!(is_vmrun(&[0x67, 0x0f, 0x01, 0xd8]));
        // VMLOAD, VMSAVE, and INVLPG with a memory operand are not it.
        assert!(!is_vmrun(&[0x0f, 0x01, 0xda]));
        assert!(!is_vmrun(&[0x0f, 0x01, 0xdb]));
        assert!(!is_vmrun(&[0x0f, 0x01, 0x38]));
        assert_eq!(classify(&[0x0f, 0x01, 0xd8]), None);
    }

    #[test]
    fn the_user_marker_port_load() {
        assert!(is_mov_edx_imm(&[0xba, 0x00, 0x06, 0x00, 0x00], 0x600));
        assert!(!is_mov_edx_imm(&[0xba, 0xf4, 0x00, 0x00, 0x00], 0x600));
        // mov dx, 0x600 (66 BA imm16) and mov edx with a REX prefix are not it.
        assert!(!is_mov_edx_imm(&[0x66, 0xba, 0x00, 0x06], 0x600));
        assert!(!is_mov_edx_imm(
            &[0x41, 0xba, 0x00, 0x06, 0x00, 0x00],
            0x600
        ));
    }

    #[test]
    fn the_user_marker_store() {
        assert!(is_mark_store(&[0x89, 0x07]));
        // mov [rdi], rax (REX.W), mov [rdi+0], eax, mov [rsi], eax, mov eax, [rdi]
        assert!(!is_mark_store(&[0x48, 0x89, 0x07]));
        assert!(!is_mark_store(&[0x89, 0x47, 0x00]));
        assert!(!is_mark_store(&[0x89, 0x06]));
        assert!(!is_mark_store(&[0x8b, 0x07]));
        // an ordinary store is nothing to classify
        assert_eq!(classify(&[0x89, 0x07]), None);
    }

    #[test]
    fn the_counted_instructions() {
        // mov cr3, rax / mov cr3, eax / mov cr3, rdi (REX.B)
        assert_eq!(classify(&[0x0f, 0x22, 0xd8]), Some(Kind::Cr3Write));
        assert_eq!(classify(&[0x41, 0x0f, 0x22, 0xdf]), Some(Kind::Cr3Write));
        // mov cr0, rax / mov cr4, rax / mov cr8 (REX.R, reg 0)
        assert_eq!(classify(&[0x0f, 0x22, 0xc0]), None);
        assert_eq!(classify(&[0x0f, 0x22, 0xe0]), None);
        assert_eq!(classify(&[0x44, 0x0f, 0x22, 0xc0]), None);
        // REX.R with reg 3 is CR11: not a CR3 write.
        assert_eq!(classify(&[0x44, 0x0f, 0x22, 0xd8]), None);
        // mov rax, cr3 (a read)
        assert_eq!(classify(&[0x0f, 0x20, 0xd8]), None);
        // invlpg [rax] / invlpg [rax+8] / swapgs / rdtscp
        assert_eq!(classify(&[0x0f, 0x01, 0x38]), Some(Kind::Invlpg));
        assert_eq!(classify(&[0x0f, 0x01, 0x78, 0x08]), Some(Kind::Invlpg));
        assert_eq!(classify(&[0x0f, 0x01, 0xf8]), None);
        assert_eq!(classify(&[0x0f, 0x01, 0xf9]), None);
        // invpcid rax, [rdi]; without 0x66 it is not invpcid
        assert_eq!(
            classify(&[0x66, 0x0f, 0x38, 0x82, 0x07]),
            Some(Kind::Invpcid)
        );
        assert_eq!(classify(&[0x0f, 0x38, 0x82, 0x07]), None);
        assert_eq!(classify(&[0x0f, 0x05]), Some(Kind::Syscall));
        assert_eq!(classify(&[0x0f, 0x34]), Some(Kind::Sysenter));
        assert_eq!(classify(&[0xcd, 0x80]), Some(Kind::IntN));
        assert_eq!(classify(&[0xcd]), None);
        assert_eq!(classify(&[0xcc]), Some(Kind::IntN));
        assert_eq!(classify(&[0x0f, 0x07]), Some(Kind::Sysret));
        assert_eq!(classify(&[0x48, 0x0f, 0x07]), Some(Kind::Sysret));
        assert_eq!(classify(&[0x0f, 0x35]), Some(Kind::Sysexit));
        assert_eq!(classify(&[0x48, 0x0f, 0x35]), Some(Kind::Sysexit));
        assert_eq!(classify(&[0xcf]), Some(Kind::Iret));
        assert_eq!(classify(&[0x48, 0xcf]), Some(Kind::Iret));
        assert_eq!(classify(&[0x66, 0xcf]), Some(Kind::Iret));
        // out dx, eax; out dx, ax is not the marker write
        assert_eq!(classify(&[0xef]), Some(Kind::Out32));
        assert_eq!(classify(&[0x66, 0xef]), None);
        assert_eq!(classify(&[0xee]), None);
    }

    #[test]
    fn the_mitigation_instructions() {
        // verw [rip+x] (Linux's mds_clear_cpu_buffers), verw ax
        assert_eq!(
            classify(&[0x0f, 0x00, 0x2d, 0x10, 0x20, 0x30, 0x40]),
            Some(Kind::Verw)
        );
        assert_eq!(classify(&[0x0f, 0x00, 0xe8]), Some(Kind::Verw));
        // verr (0F 00 /4), ltr (0F 00 /3): not VERW
        assert_eq!(classify(&[0x0f, 0x00, 0xe0]), None);
        assert_eq!(classify(&[0x0f, 0x00, 0xd8]), None);
        assert_eq!(classify(&[0x0f, 0xae, 0xe8]), Some(Kind::Lfence));
        // mfence (F0), sfence (F8), xrstor [rax] (0F AE /5 memory)
        assert_eq!(classify(&[0x0f, 0xae, 0xf0]), None);
        assert_eq!(classify(&[0x0f, 0xae, 0xf8]), None);
        assert_eq!(classify(&[0x0f, 0xae, 0x28]), None);
        assert_eq!(classify(&[0x0f, 0x30]), Some(Kind::Wrmsr));
        // rdmsr
        assert_eq!(classify(&[0x0f, 0x32]), None);
    }

    #[test]
    fn the_msr_number_before_a_wrmsr() {
        assert_eq!(mov_ecx_imm(&[0xb9, 0x48, 0, 0, 0]), Some(0x48));
        assert_eq!(mov_ecx_imm(&[0xba, 0x48, 0, 0, 0]), None);
        assert_eq!(mov_ecx_imm(&[0x41, 0xb9, 0x48, 0, 0, 0]), None);
        // IBRS_ENTER: mov rdx, gs:[x]; mov eax, edx; shr rdx, 32: ecx kept
        assert!(keeps_ecx(&[0x65, 0x48, 0x8b, 0x14, 0x25, 0, 0, 0, 0]));
        assert!(keeps_ecx(&[0x89, 0xd0]));
        assert!(keeps_ecx(&[0x48, 0xc1, 0xea, 0x20]));
        // mov ecx, eax (89 C1), xor ecx, ecx (31 C9), pop rcx, an unknown op
        assert!(!keeps_ecx(&[0x89, 0xc1]));
        assert!(!keeps_ecx(&[0x31, 0xc9]));
        assert!(!keeps_ecx(&[0x59]));
        assert!(!keeps_ecx(&[0xe8, 0, 0, 0, 0]));
    }

    #[test]
    fn rep_string_instructions() {
        // rep movsb, rep stosq (REX.W), repe cmpsb, rep insb, rep outsd
        assert!(is_rep_string(&[0xf3, 0xa4]));
        assert!(is_rep_string(&[0xf3, 0x48, 0xab]));
        assert!(is_rep_string(&[0xf3, 0xa6]));
        assert!(is_rep_string(&[0xf2, 0xae]));
        assert!(is_rep_string(&[0xf3, 0x6c]));
        assert!(is_rep_string(&[0x66, 0xf3, 0x6f]));
        // movsb without rep, rep ret, pause, a lone prefix
        assert!(!is_rep_string(&[0xa4]));
        assert!(!is_rep_string(&[0xf3, 0xc3]));
        assert!(!is_rep_string(&[0xf3, 0x90]));
        assert!(!is_rep_string(&[0xf3]));
        assert!(!is_rep_string(&[]));
    }

    #[test]
    fn prefixes_and_odd_input() {
        // segment override + REX.W: still SYSRET
        assert_eq!(classify(&[0x2e, 0x48, 0x0f, 0x07]), Some(Kind::Sysret));
        // a lone 0x48 (DEC EAX in 32-bit code) is nothing
        assert_eq!(classify(&[0x48]), None);
        assert_eq!(classify(&[]), None);
        assert_eq!(classify(&[0x66; 20]), None);
        assert_eq!(classify(&[0x0f]), None);
        // a legacy prefix after REX cancels REX.R: mov cr3 again
        assert_eq!(
            classify(&[0x44, 0x2e, 0x0f, 0x22, 0xd8]),
            Some(Kind::Cr3Write)
        );
    }
}
