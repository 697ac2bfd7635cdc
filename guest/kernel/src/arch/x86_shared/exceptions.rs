//! The fatal exception report, shared by both flavours: the `@fault` line
//! (`vector= name= error= rip= cr2= cr3= cs= rsp= mode=`; `rip` is EIP on x86).
use crate::{println, stop};
use ptiscope_abi::exit_status;

pub const NAMES: [(&str, &str); 32] = [
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

/// What the CPU reported, widened to 64 bits.
pub struct Fault {
    pub vector: u64,
    pub error: u64,
    pub ip: u64,
    pub cs: u64,
    pub sp: u64,
    pub cr2: u64,
    pub cr3: u64,
}

/// Prints the report and stops the VM with `EXCEPTION`.
pub fn report(f: &Fault) -> ! {
    if f.vector == 14 {
        crate::telemetry::inc(ptiscope_abi::telemetry::Counter::PageFaults);
    }
    let (name, long) = NAMES[(f.vector & 31) as usize];
    let mode = if f.cs & 3 == 3 { "user" } else { "kernel" };
    println!(
        "exception: {long} ({name}, vector {}) in {mode} mode at rip={:#x}, error code {:#x}, cr2={:#x}, cr3={:#x}, rsp={:#x}",
        f.vector, f.ip, f.error, f.cr2, f.cr3, f.sp
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
        f.vector, f.error, f.ip, f.cr2, f.cr3, f.cs, f.sp
    );
    stop(exit_status::EXCEPTION)
}
