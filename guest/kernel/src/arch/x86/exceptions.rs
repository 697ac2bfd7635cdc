//! The Rust side of the fatal exception path (`exc_common` in entry.rs).
use crate::arch::x86_shared::exceptions::{report, Fault};

/// What `exc_common` pushed (PUSHA order), lowest address first. `esp` and
/// `ss` exist only for exceptions from user mode (a CPL change).
#[repr(C)]
pub struct TrapFrame {
    pub edi: u32,
    pub esi: u32,
    pub ebp: u32,
    pub esp_pusha: u32,
    pub ebx: u32,
    pub edx: u32,
    pub ecx: u32,
    pub eax: u32,
    pub vector: u32,
    pub error: u32,
    pub eip: u32,
    pub cs: u32,
    pub eflags: u32,
    pub esp: u32,
    pub ss: u32,
}

extern "C" {
    /// The RDMSR of `cpu::rdmsr_safe` (a code label).
    static rdmsr_safe_insn: u8;
}

/// Reports the exception and stops the VM with `EXCEPTION`, except a #GP
/// of `rdmsr_safe` in kernel mode, which it fixes up and returns from.
///
/// # Safety
/// Called only from `exc_common` with a pointer to the frame it built.
#[no_mangle]
pub unsafe extern "C" fn exception_handler(frame: *mut TrapFrame, cr3: u32) {
    // SAFETY: exc_common passes the frame it just pushed; nothing else
    // refers to it while this handler runs.
    let f = unsafe { &mut *frame };
    let user = f.cs & 3 == 3;
    if f.vector == 13 && !user && f.eip == core::ptr::addr_of!(rdmsr_safe_insn) as u32 {
        f.eip += 2;
        f.esi = 0;
        f.eax = 0;
        f.edx = 0;
        return;
    }
    // From kernel mode the CPU pushed no ESP: the stack was right above EFLAGS.
    let sp = if user {
        f.esp
    } else {
        core::ptr::addr_of!(f.esp) as u32
    };
    report(&Fault {
        vector: f.vector as u64,
        error: f.error as u64,
        ip: f.eip as u64,
        cs: f.cs as u64,
        sp: sp as u64,
        cr2: super::cpu::read_cr2(),
        cr3: cr3 as u64,
    })
}
