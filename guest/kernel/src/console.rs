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
    let _ = fmt::Write::write_fmt(&mut Console, args);
    if !nested {
        OWNER.store(0, Ordering::Release);
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
