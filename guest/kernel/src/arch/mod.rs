//! Architecture-specific code, Redox style: `x86_64` (4-level paging) and
//! `x86` (32-bit PAE) side by side, `x86_shared` for what both use. Each
//! flavour exports the same module names (boot, context, cpu, descriptors,
//! entry, exceptions, paging, sysentry, layout) so that the shared kernel
//! (main, task, syscall, ...) is written once.
pub mod x86_shared;

#[cfg(target_arch = "x86_64")]
pub mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::*;

#[cfg(target_arch = "x86")]
pub mod x86;
#[cfg(target_arch = "x86")]
pub use self::x86::*;
