//! Code shared by the x86_64 and the 32-bit PAE flavour.
pub mod address_space;
pub mod cpu;
pub mod exceptions;
pub mod io;
pub mod serial;
pub mod smp;
pub mod user;

/// The 32 exception vectors as invocations of the flavour's stub macros:
/// `EXC_ERR n` where the CPU pushes an error code (8, 10-14, 17, 21, 29,
/// 30), `EXC_NOERR n` elsewhere. Architectural, so written once; each
/// flavour's entry.rs defines the two macros for its stack width and splices
/// this list into its `global_asm!`.
macro_rules! exception_stub_list {
    () => {
        "
    EXC_NOERR 0
    EXC_NOERR 1
    EXC_NOERR 2
    EXC_NOERR 3
    EXC_NOERR 4
    EXC_NOERR 5
    EXC_NOERR 6
    EXC_NOERR 7
    EXC_ERR 8
    EXC_NOERR 9
    EXC_ERR 10
    EXC_ERR 11
    EXC_ERR 12
    EXC_ERR 13
    EXC_ERR 14
    EXC_NOERR 15
    EXC_NOERR 16
    EXC_ERR 17
    EXC_NOERR 18
    EXC_NOERR 19
    EXC_NOERR 20
    EXC_ERR 21
    EXC_NOERR 22
    EXC_NOERR 23
    EXC_NOERR 24
    EXC_NOERR 25
    EXC_NOERR 26
    EXC_NOERR 27
    EXC_NOERR 28
    EXC_ERR 29
    EXC_ERR 30
    EXC_NOERR 31
"
    };
}
pub(crate) use exception_stub_list;
