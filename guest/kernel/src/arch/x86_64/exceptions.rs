//! The Rust side of the fatal exception path (`exc_common` in entry.rs).
use crate::arch::x86_shared::exceptions::{report, Fault};

/// What `exc_common` pushed, lowest address first.
#[repr(C)]
pub struct TrapFrame {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rbp: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rbx: u64,
    pub rax: u64,
    pub vector: u64,
    pub error: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

extern "C" {
    /// The RDMSR of `cpu::rdmsr_safe` (a code label).
    static rdmsr_safe_insn: u8;
}

/// Reports the exception on the console and stops the VM with `EXCEPTION`,
/// except a #GP of `rdmsr_safe` in kernel mode, which it fixes up (skip the
/// 2-byte RDMSR, report failure in rsi) and returns from, to resume.
///
/// # Safety
/// Called only from `exc_common` with a pointer to the frame it built.
#[no_mangle]
pub unsafe extern "C" fn exception_handler(frame: *mut TrapFrame, cr3: u64) {
    // SAFETY: exc_common passes the frame it just pushed; nothing else
    // refers to it while this handler runs.
    let f = unsafe { &mut *frame };
    if f.vector == 13 && f.cs & 3 == 0 && f.rip == core::ptr::addr_of!(rdmsr_safe_insn) as u64 {
        f.rip += 2;
        f.rsi = 0;
        f.rax = 0;
        f.rdx = 0;
        return;
    }
    report(&Fault {
        vector: f.vector,
        error: f.error,
        ip: f.rip,
        cs: f.cs,
        sp: f.rsp,
        cr2: super::cpu::read_cr2(),
        cr3,
    })
}
