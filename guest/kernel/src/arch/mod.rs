//! Architecture-specific code. `x86_shared` serves both x86 flavours; the
//! 32-bit PAE flavour will sit beside `x86_64` as `x86`.
pub mod x86_shared;

#[cfg(target_arch = "x86_64")]
pub mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::*;
