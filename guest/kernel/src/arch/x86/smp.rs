//! The x86_32 PAE flavour runs on one CPU: `cpus=` above 1 is refused
//! (`UNSUPPORTED`) before anything here is used.
use core::sync::atomic::AtomicU64;

/// Wake-up IPIs sent: none on one CPU.
pub static IPIS_SENT: AtomicU64 = AtomicU64::new(0);

pub fn init_bsp(_cpus: usize, _kernel_root: u64) {}

pub fn start_aps() -> usize {
    1
}

pub fn online() -> usize {
    1
}

pub fn cpus() -> usize {
    1
}

pub fn wake_cpu(_cpu: usize) {}

/// Never reached on one CPU: CPU 0 runs until all tasks are done.
pub fn idle_wait() {}

/// poundsyscall's worker program: not built for this flavour yet.
pub fn pound_program(_entry_code: u32) -> Option<u64> {
    None
}

pub fn current_cr3() -> u64 {
    0
}

/// Nothing to set up: the statics of CPU 0 are the per-CPU data.
pub fn init_boot_cpu() {}

/// Never called: no AP is started on this flavour.
pub fn ap_setup(_kernel_cr3: u64, _cr4: u64) {}
