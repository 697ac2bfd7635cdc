//! The Rust side of the fatal exception path (`exc_common` in entry.rs).
use crate::{println, stop};
use ptiscope_abi::exit_status;

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

const NAMES: [(&str, &str); 32] = [
    ("#DE", "divide error"),
    ("#DB", "debug"),
    ("NMI", "non-maskable interrupt"),
    ("#BP", "breakpoint"),
    ("#OF", "overflow"),
    ("#BR", "bound range exceeded"),
    ("#UD", "invalid opcode"),
    ("#NM", "device not available"),
    ("#DF", "double fault"),
    ("#CSO", "coprocessor segment overrun"),
    ("#TS", "invalid TSS"),
    ("#NP", "segment not present"),
    ("#SS", "stack-segment fault"),
    ("#GP", "general protection"),
    ("#PF", "page fault"),
    ("#15", "reserved"),
    ("#MF", "x87 floating-point error"),
    ("#AC", "alignment check"),
    ("#MC", "machine check"),
    ("#XM", "SIMD floating-point"),
    ("#VE", "virtualization exception"),
    ("#CP", "control protection"),
    ("#22", "reserved"),
    ("#23", "reserved"),
    ("#24", "reserved"),
    ("#25", "reserved"),
    ("#26", "reserved"),
    ("#27", "reserved"),
    ("#HV", "hypervisor injection"),
    ("#VC", "VMM communication"),
    ("#SX", "security exception"),
    ("#31", "reserved"),
];

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
    if f.vector == 14 {
        crate::telemetry::inc(ptiscope_abi::telemetry::Counter::PageFaults);
    }
    let (name, long) = NAMES[(f.vector & 31) as usize];
    let cr2 = super::cpu::read_cr2();
    let mode = if f.cs & 3 == 3 { "user" } else { "kernel" };
    println!(
        "exception: {long} ({name}, vector {}) in {mode} mode at rip={:#x}, error code {:#x}, cr2={:#x}, cr3={:#x}, rsp={:#x}",
        f.vector, f.rip, f.error, cr2, cr3, f.rsp
    );
    if f.vector == 14 {
        let e = f.error;
        println!(
            "  page fault: {} {} access, {} mode{}",
            if e & 1 != 0 {
                "protection violation on a"
            } else {
                "not-present page on a"
            },
            if e & 16 != 0 {
                "instruction fetch"
            } else if e & 2 != 0 {
                "write"
            } else {
                "read"
            },
            if e & 4 != 0 { "user" } else { "supervisor" },
            if e & 8 != 0 { ", reserved bit set" } else { "" }
        );
    }
    println!(
        "@fault vector={} name={name} error={:#x} rip={:#x} cr2={:#x} cr3={:#x} cs={:#x} rsp={:#x} mode={mode}",
        f.vector, f.error, f.rip, cr2, cr3, f.cs, f.rsp
    );
    stop(exit_status::EXCEPTION)
}
