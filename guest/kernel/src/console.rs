//! The console: COM1. Human text, plus machine lines starting with `@`.
//! With several CPUs a line is written whole under a lock, so machine lines
//! never interleave; the lock is re-entrant per CPU (a fault report in the
//! middle of a print on the same CPU goes through).
//!
//! Where the VMM offers ptiscope's console-line port (`port::CONSOLE_LINE`:
//! our VMM does, QEMU does not, the first line asks), a line is gathered in
//! a record in .bss and handed over with one `out`: one VM exit per line
//! instead of one per byte where `rep outsb` exits per byte (kvm_pvm,
//! ~10 µs each: most of a default boot's time). Elsewhere the bytes go to
//! COM1 itself.
use core::cell::UnsafeCell;
use core::fmt;
use core::sync::atomic::{AtomicUsize, Ordering};
use ptiscope_abi::port::{CONSOLE_LINE, CONSOLE_LINE_MAGIC, CONSOLE_LINE_MAX};

/// The console-line port: 0 not asked yet, `usize::MAX` absent, else the
/// physical address of the console's record.
static LINE_PORT: AtomicUsize = AtomicUsize::new(0);

/// A console-line record, as the VMM reads it.
#[repr(C)]
struct Record {
    len: u32,
    bytes: [u8; CONSOLE_LINE_MAX],
}

/// The console lock and the record it owns.
struct Console {
    /// 0 free, else the owning CPU + 1.
    owner: AtomicUsize,
    /// The line being gathered.
    record: UnsafeCell<Record>,
}

// SAFETY: the record is touched only by the CPU that holds `owner` (taken
// with Acquire, given back with Release by `Line`). On that CPU a nested
// line (a fault or panic report in the middle of a line) takes the record
// over from the outer line, which never resumes: both end in `stop`.
unsafe impl Sync for Console {}

impl Console {
    /// The record.
    ///
    /// # Safety
    /// This CPU holds the console lock, and no other reference to the
    /// record is live.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn record(&self) -> &mut Record {
        // SAFETY: delegated to the caller.
        unsafe { &mut *self.record.get() }
    }
}

static CONSOLE: Console = Console {
    owner: AtomicUsize::new(0),
    record: UnsafeCell::new(Record {
        len: 0,
        bytes: [0; CONSOLE_LINE_MAX],
    }),
};

/// The physical address of the record if the VMM has the console-line port
/// (asked once: a 32-bit `in` reads its magic).
fn line_port() -> Option<u32> {
    match LINE_PORT.load(Ordering::Relaxed) {
        0 => {}
        usize::MAX => return None,
        phys => return Some(phys as u32),
    }
    let magic: u32;
    // SAFETY: a port read; ports no device claims read as all ones.
    unsafe {
        core::arch::asm!("in eax, dx", out("eax") magic, in("dx") CONSOLE_LINE,
                         options(nomem, nostack, preserves_flags))
    };
    let end = core::mem::size_of::<Record>() as u64;
    let phys = crate::arch::layout::virt_to_phys(CONSOLE.record.get() as usize as u64)
        .filter(|&p| magic == CONSOLE_LINE_MAGIC && p + end <= u32::MAX as u64);
    LINE_PORT.store(phys.map_or(usize::MAX, |p| p as usize), Ordering::Relaxed);
    phys.map(|p| p as u32)
}

/// Hands the gathered bytes to the VMM (one exit), if there are any.
fn flush(phys: u32) {
    // SAFETY: under the console lock, on this CPU; no other reference lives.
    let r = unsafe { CONSOLE.record() };
    if r.len != 0 {
        // Not `io::outl`, which is `nomem`: the VMM reads the record, so
        // the stores into it must happen before the `out` (a `nomem` one
        // lets the compiler drop the last length store, followed by ours).
        // SAFETY: a port write that only reads memory (the record).
        unsafe {
            core::arch::asm!("out dx, eax", in("dx") CONSOLE_LINE, in("eax") phys,
                             options(nostack, preserves_flags, readonly))
        };
        r.len = 0;
    }
}

/// `rep movsb`: one instruction for a whole piece, where a `memcpy` call
/// costs a dozen or more emulated ones per piece.
///
/// # Safety
/// `dst` and `src` valid for `n` bytes, not overlapping.
#[inline(always)]
unsafe fn copy_bytes(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: delegated to the caller.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("rep movsb", inout("rdi") dst => _, inout("rsi") src => _,
                         inout("rcx") n => _, options(nostack, preserves_flags))
    }
    // SAFETY: as above (esi is reserved by LLVM on x86: swapped around it).
    #[cfg(target_arch = "x86")]
    unsafe {
        core::arch::asm!("xchg esi, {s}", "rep movsb", "xchg esi, {s}", s = inout(reg) src => _,
                         inout("edi") dst => _, inout("ecx") n => _, options(nostack, preserves_flags))
    }
}

/// Adds `bytes` to the record, handing it over whenever it is full. A
/// piece that fits with room to spare (every boot line's) is one bounds
/// check and one copy, written in place: each emulated instruction counts
/// on software-KVM hosts, and a line has tens of pieces.
#[inline(always)]
fn gather(phys: u32, bytes: &[u8]) {
    // SAFETY: as in `flush`; the reference ends before `gather_split` runs.
    let r = unsafe { CONSOLE.record() };
    let len = r.len as usize;
    if len < CONSOLE_LINE_MAX && bytes.len() < CONSOLE_LINE_MAX - len {
        // SAFETY: `len + bytes.len() < CONSOLE_LINE_MAX`: the copy stays
        // inside the record (DF is clear in kernel code).
        unsafe { copy_bytes(r.bytes.as_mut_ptr().add(len), bytes.as_ptr(), bytes.len()) };
        r.len = (len + bytes.len()) as u32;
        return;
    }
    gather_split(phys, bytes)
}

/// [`gather`] of a piece that fills the record: copied in parts, the
/// record handed over each time it is full.
#[cold]
#[inline(never)]
fn gather_split(phys: u32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: as in `flush`; the reference ends before `flush` runs.
        let r = unsafe { CONSOLE.record() };
        let len = (r.len as usize).min(CONSOLE_LINE_MAX);
        let n = bytes.len().min(CONSOLE_LINE_MAX - len);
        // SAFETY: `len + n <= CONSOLE_LINE_MAX`: the copy stays inside the
        // record; `bytes` has at least `n` bytes (DF is clear in kernel code).
        unsafe { copy_bytes(r.bytes.as_mut_ptr().add(len), bytes.as_ptr(), n) };
        r.len = (len + n) as u32;
        bytes = &bytes[n..];
        if len + n == CONSOLE_LINE_MAX {
            flush(phys);
        }
    }
}

/// Writes `args` as one unit with respect to other CPUs.
pub fn print(args: fmt::Arguments<'_>) {
    let mut line = Line::start();
    let _ = fmt::Write::write_fmt(&mut line, args);
}

/// A line written piece by piece under the console lock (taken by
/// [`Line::start`], released when the `Line` is dropped), without
/// `core::fmt`: for the boot lines. Each kernel instruction is emulated on
/// software-KVM hosts (kvm_pvm), and `core::fmt` spends hundreds of them
/// per line on what a few `str`, [`Line::dec`] and [`Line::hex`] calls do
/// in tens. The caller writes the final `'\n'`.
pub struct Line {
    nested: bool,
    /// The record's physical address if the line is gathered there.
    record: Option<u32>,
}

impl Line {
    /// Takes the console lock (re-entrant on this CPU).
    pub fn start() -> Line {
        let me = crate::arch::percpu::cpu() + 1;
        let nested = CONSOLE.owner.load(Ordering::Relaxed) == me;
        if !nested {
            while CONSOLE
                .owner
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                core::hint::spin_loop();
            }
        }
        let record = line_port();
        // A line printed in the middle of another on this CPU (a fault
        // report) hands over what the outer one gathered, then goes to
        // COM1 directly: the outer line may never resume.
        if let (true, Some(phys)) = (nested, record) {
            flush(phys);
        }
        Line {
            nested,
            record: record.filter(|_| !nested),
        }
    }

    fn bytes(&mut self, b: &[u8]) {
        match self.record {
            Some(phys) => gather(phys, b),
            None => crate::arch::x86_shared::serial::write_bytes(b),
        }
    }

    /// Writes `s`.
    pub fn str(&mut self, s: &str) -> &mut Line {
        self.bytes(s.as_bytes());
        self
    }

    /// Writes `v` in decimal, as `{}` does.
    pub fn dec(&mut self, v: u64) -> &mut Line {
        let mut buf = [0u8; 20];
        self.bytes(guest_core::numfmt::format_dec(v, &mut buf));
        self
    }

    /// Writes `v` in hexadecimal with `0x`, as `{:#x}` does.
    pub fn hex(&mut self, v: u64) -> &mut Line {
        let mut buf = [0u8; 18];
        self.bytes(guest_core::numfmt::format_hex(v, &mut buf));
        self
    }
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.bytes(s.as_bytes());
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if let Some(phys) = self.record {
            flush(phys);
        }
        if !self.nested {
            CONSOLE.owner.store(0, Ordering::Release);
        }
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
