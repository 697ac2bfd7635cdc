//! The console: COM1. Human text, plus machine lines starting with `@`.
//! With several CPUs a line is written whole under a lock, so machine lines
//! never interleave; the lock is re-entrant per CPU (a fault report in the
//! middle of a print on the same CPU goes through).
use core::fmt;
use core::sync::atomic::{AtomicUsize, Ordering};

pub struct Console;

/// 0 free, else the owning CPU + 1.
static OWNER: AtomicUsize = AtomicUsize::new(0);

/// Writes `args` as one unit with respect to other CPUs.
pub fn print(args: fmt::Arguments<'_>) {
    let _line = Line::start();
    let _ = fmt::Write::write_fmt(&mut Console, args);
}

/// A line written piece by piece under the console lock (taken by
/// [`Line::start`], released when the `Line` is dropped), without
/// `core::fmt`: for the boot lines. Each kernel instruction is emulated on
/// software-KVM hosts (kvm_pvm), and `core::fmt` spends hundreds of them
/// per line on what a few `str`, [`Line::dec`] and [`Line::hex`] calls do
/// in tens. The caller writes the final `'\n'`.
pub struct Line {
    nested: bool,
}

impl Line {
    /// Takes the console lock (re-entrant on this CPU).
    pub fn start() -> Line {
        let me = crate::arch::percpu::cpu() + 1;
        let nested = OWNER.load(Ordering::Relaxed) == me;
        if !nested {
            while OWNER
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                core::hint::spin_loop();
            }
        }
        Line { nested }
    }

    /// Writes `s`.
    pub fn str(&mut self, s: &str) -> &mut Line {
        crate::arch::x86_shared::serial::write_bytes(s.as_bytes());
        self
    }

    /// Writes `v` in decimal, as `{}` does.
    pub fn dec(&mut self, v: u64) -> &mut Line {
        let mut buf = [0u8; 20];
        let digits = guest_core::numfmt::format_dec(v, &mut buf);
        crate::arch::x86_shared::serial::write_bytes(digits);
        self
    }

    /// Writes `v` in hexadecimal with `0x`, as `{:#x}` does.
    pub fn hex(&mut self, v: u64) -> &mut Line {
        let mut buf = [0u8; 18];
        let digits = guest_core::numfmt::format_hex(v, &mut buf);
        crate::arch::x86_shared::serial::write_bytes(digits);
        self
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if !self.nested {
            OWNER.store(0, Ordering::Release);
        }
    }
}

impl fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        crate::arch::x86_shared::serial::write_bytes(s.as_bytes());
        Ok(())
    }
}

#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {{
        $crate::console::print(format_args!($($arg)*));
    }};
}

#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {{
        $crate::console::print(format_args!("{}\n", format_args!($($arg)*)));
    }};
}
