//! The few system interfaces the init needs beyond `std`: raw system calls
//! for the measured loops (inline assembly, so the loop body is exactly one
//! entry instruction and a compare), musl's C entry points for the rest,
//! the phase-marker stores (to a `/dev/mem` page) and port I/O for the exit
//! port (and the fallback phase-marker port).

use core::arch::asm;
use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};

extern "C" {
    fn ioperm(from: c_ulong, num: c_ulong, turn_on: c_int) -> c_int;
    fn reboot(cmd: c_int) -> c_int;
    fn klogctl(kind: c_int, buf: *mut c_char, len: c_int) -> c_int;
    fn mount(
        src: *const c_char,
        target: *const c_char,
        fstype: *const c_char,
        flags: c_ulong,
        data: *const c_void,
    ) -> c_int;
    fn fork() -> c_int;
    fn _exit(status: c_int) -> !;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn pipe(fds: *mut c_int) -> c_int;
    fn socketpair(domain: c_int, kind: c_int, protocol: c_int, fds: *mut c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, len: usize) -> isize;
    fn write(fd: c_int, buf: *const c_void, len: usize) -> isize;
    fn close(fd: c_int) -> c_int;
    fn tcdrain(fd: c_int) -> c_int;
    fn clock_gettime(clock: c_int, ts: *mut [c_long; 2]) -> c_int;
    fn sched_setaffinity(pid: c_int, size: usize, mask: *const c_ulong) -> c_int;
    fn mknod(path: *const c_char, mode: c_uint, dev: u64) -> c_int;
    // musl's off_t is 64 bits on every target (mmap2 underneath on i386).
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void;
    #[cfg(target_arch = "x86")]
    fn getauxval(kind: c_ulong) -> c_ulong;
}

/// System call numbers of the measured calls, for this architecture.
#[cfg(target_arch = "x86_64")]
pub mod nr {
    /// `write`.
    pub const WRITE: usize = 1;
    /// `getpid`.
    pub const GETPID: usize = 39;
    /// `getppid`.
    pub const GETPPID: usize = 110;
}

/// System call numbers of the measured calls, for this architecture.
#[cfg(target_arch = "x86")]
pub mod nr {
    /// `write`.
    pub const WRITE: usize = 4;
    /// `getpid`.
    pub const GETPID: usize = 20;
    /// `getppid`.
    pub const GETPPID: usize = 64;
}

/// How the measured loops enter the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// x86_64: the `syscall` instruction.
    #[cfg(target_arch = "x86_64")]
    Syscall,
    /// i386: `int $0x80`.
    #[cfg(target_arch = "x86")]
    Int80,
    /// i386: a call to the vDSO's `__kernel_vsyscall` (SYSENTER where the
    /// CPU has it), at this address.
    #[cfg(target_arch = "x86")]
    Vsyscall(usize),
}

/// The vDSO's `__kernel_vsyscall` (AT_SYSINFO of the auxiliary vector).
#[cfg(target_arch = "x86")]
pub fn vsyscall_address() -> Option<usize> {
    // SAFETY: getauxval only reads the process's auxiliary vector.
    let a = unsafe { getauxval(32) } as usize;
    (a != 0).then_some(a)
}

/// One system call with up to three arguments through `gate`.
#[inline(always)]
pub fn syscall3(gate: Gate, nr: usize, a0: usize, a1: usize, a2: usize) -> isize {
    let ret: isize;
    match gate {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a Linux system call; the kernel clobbers rcx and r11 only.
        Gate::Syscall => unsafe {
            asm!("syscall", inlateout("rax") nr as isize => ret, in("rdi") a0, in("rsi") a1,
                 in("rdx") a2, lateout("rcx") _, lateout("r11") _, options(nostack));
        },
        #[cfg(target_arch = "x86")]
        // SAFETY: a Linux system call; `int $0x80` preserves every register but eax.
        Gate::Int80 => unsafe {
            asm!("int $0x80", inlateout("eax") nr as isize => ret, in("ebx") a0, in("ecx") a1,
                 in("edx") a2, options(nostack));
        },
        #[cfg(target_arch = "x86")]
        // SAFETY: __kernel_vsyscall is the vDSO's system-call entry; it
        // preserves every register but eax and uses the caller's stack.
        Gate::Vsyscall(entry) => unsafe {
            asm!("call {entry}", entry = in(reg) entry, inlateout("eax") nr as isize => ret,
                 in("ebx") a0, in("ecx") a1, in("edx") a2);
        },
    }
    ret
}

/// The time-stamp counter.
#[inline(always)]
pub fn rdtsc() -> u64 {
    let lo: u32;
    let hi: u32;
    // SAFETY: RDTSC reads a counter; user mode may run it (CR4.TSD is clear on Linux).
    unsafe { asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack)) };
    (hi as u64) << 32 | lo as u64
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = [0 as c_long; 2];
    // SAFETY: `ts` is a valid timespec-sized buffer.
    unsafe { clock_gettime(1, &mut ts) };
    ts[0] as u64 * 1_000_000_000 + ts[1] as u64
}

/// Grants this thread (and the threads and processes it starts) the ports
/// `from..from + len`.
pub fn grant_ports(from: u16, len: u16) -> std::io::Result<()> {
    // SAFETY: ioperm takes plain integers.
    if unsafe { ioperm(from as c_ulong, len as c_ulong, 1) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A 32-bit port write (after [`grant_ports`]).
pub fn outl(port: u16, value: u32) {
    // SAFETY: the port was granted by ioperm; a write to the phase or exit
    // port has no effect on this process's memory.
    unsafe { asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack)) };
}

/// Writes `bytes` to `port`, one `out dx, al` each (QEMU's isa-debugcon
/// takes them; after [`grant_ports`]).
pub fn out_bytes(port: u16, bytes: &[u8]) {
    for &b in bytes {
        // SAFETY: the port was granted by ioperm; the write has no effect
        // on this process's memory.
        unsafe { asm!("out dx, al", in("dx") port, in("al") b, options(nomem, nostack)) };
    }
}

/// A phase-marker write to port 0x600 (after [`grant_ports`]), as the
/// QEMU plugin recognises it (its `umark=` rule): `mov edx, 0x600`
/// (`BA 00 06 00 00`) immediately followed by `out dx, eax`, in one asm
/// block so that nothing comes between them. `.p2align 4` starts the pair
/// on a 16-byte boundary: its 6 bytes never cross a page, so TCG never
/// ends a translation block between the two. Inlined: the begin and end
/// markers are then two distinct instructions, as the plugin's phase
/// pattern asks.
#[inline(always)]
pub fn phase_mark(value: u32) {
    const _: () = assert!(ptiscope_abi::port::PHASE == 0x600);
    // SAFETY: the port was granted by ioperm; a write to the phase port has
    // no effect on this process's memory.
    unsafe {
        asm!(
            ".p2align 4",
            "mov edx, 0x600",
            "out dx, eax",
            in("eax") value,
            out("edx") _,
            options(nomem, nostack)
        )
    };
}

/// The same marker as [`phase_mark`], as a 32-bit store to `page` (the
/// mapped MMIO marker page, [`map_device_page`]), which needs no I/O
/// permission: `mov edx, 0x600` (`BA 00 06 00 00`) immediately followed by
/// `mov dword ptr [edi], eax` (`89 07`; `[rdi]` in 64-bit code), the pair
/// the plugin's `umark=` rule recognises, in one 16-byte-aligned asm block
/// (7 bytes: never across a page, never split between two translation
/// blocks). EDX carries nothing to the host here; it names the pair.
#[inline(always)]
pub fn phase_mark_mmio(page: *mut u32, value: u32) {
    // SAFETY: `page` is a writable shared mapping of a page no RAM backs
    // (made by `map_device_page`, never unmapped): the store reaches the
    // host's MMIO handler or nothing, never this process's memory.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        asm!(
            ".p2align 4",
            "mov edx, 0x600",
            "mov dword ptr [rdi], eax",
            in("rdi") page,
            in("eax") value,
            out("edx") _,
            options(nostack)
        )
    };
    // SAFETY: as above.
    #[cfg(target_arch = "x86")]
    unsafe {
        asm!(
            ".p2align 4",
            "mov edx, 0x600",
            "mov dword ptr [edi], eax",
            in("edi") page,
            in("eax") value,
            out("edx") _,
            options(nostack)
        )
    };
}

/// Maps the 4 KiB page at guest-physical `phys` from `/dev/mem` (made
/// first: the initramfs has no devtmpfs), writable, shared, uncached
/// (O_SYNC); `Err` is a short reason (`step:errno`) for the `@marker` line.
pub fn map_device_page(phys: u64) -> Result<*mut u32, String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    const S_IFCHR: c_uint = 0o020000;
    // makedev(1, 1): the memory driver's /dev/mem.
    const DEV_MEM: u64 = 0x101;
    const O_SYNC: c_int = 0o4010000;
    const PROT_READ_WRITE: c_int = 3;
    const MAP_SHARED: c_int = 1;
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(0);
    // SAFETY: a NUL-terminated path; mknod creates a node, nothing more.
    if unsafe { mknod(c"/dev/mem".as_ptr(), S_IFCHR | 0o600, DEV_MEM) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(format!("mknod-dev-mem:{}", errno(e)));
        }
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(O_SYNC)
        .open("/dev/mem")
        .map_err(|e| format!("open-dev-mem:{}", errno(e)))?;
    let offset = i64::try_from(phys).map_err(|_| "address-too-high:0".to_string())?;
    // SAFETY: a new mapping chosen by the kernel; the file is open.
    let p = unsafe {
        mmap(
            core::ptr::null_mut(),
            4096,
            PROT_READ_WRITE,
            MAP_SHARED,
            file.as_raw_fd(),
            offset,
        )
    };
    // MAP_FAILED is (void *)-1. The mapping outlives the descriptor.
    if p as isize == -1 {
        return Err(format!(
            "mmap-dev-mem:{}",
            errno(std::io::Error::last_os_error())
        ));
    }
    Ok(p.cast())
}

/// Waits until the console (fd 1, the serial port's tty) has sent what
/// was written to it: a `write` returns once the tty has the bytes, and an
/// exit-port write right after would end the VM before the UART sent them.
pub fn drain_console() {
    // SAFETY: tcdrain takes a descriptor; on a non-tty it fails harmlessly.
    unsafe { tcdrain(1) };
}

/// reboot(RB_POWER_OFF).
pub fn power_off() {
    // SAFETY: a plain system call; PID 1 has CAP_SYS_BOOT.
    unsafe { reboot(0x4321_fedc_u32 as c_int) };
}

/// The whole kernel log buffer (klogctl READ_ALL), at most `cap` bytes.
pub fn kernel_log(cap: usize) -> std::io::Result<String> {
    // SAFETY: SYSLOG_ACTION_SIZE_BUFFER takes no buffer.
    let size = unsafe { klogctl(10, core::ptr::null_mut(), 0) };
    if size < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let len = (size as usize).clamp(4096, cap);
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` has `len` writable bytes.
    let n = unsafe { klogctl(3, buf.as_mut_ptr().cast(), len as c_int) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Mounts procfs at /proc (creating the directory).
pub fn mount_proc() -> std::io::Result<()> {
    mount_pseudo(c"proc", c"/proc")
}

/// Mounts the kernel's pseudo file system `fs` (procfs, sysfs) at `dir`,
/// creating the directory first.
pub fn mount_pseudo(fs: &std::ffi::CStr, dir: &std::ffi::CStr) -> std::io::Result<()> {
    if let Ok(path) = dir.to_str() {
        let _ = std::fs::create_dir(path);
    }
    // SAFETY: NUL-terminated strings that outlive the call; no data argument.
    let r = unsafe { mount(fs.as_ptr(), dir.as_ptr(), fs.as_ptr(), 0, core::ptr::null()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Most CPUs [`pin_to_cpu`] can name (the mask's bits).
pub const MAX_PIN_CPU: usize = 1024;

/// Pins the calling process to `cpu` alone (sched_setaffinity).
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    const BITS: usize = c_ulong::BITS as usize;
    if cpu >= MAX_PIN_CPU {
        return Err(std::io::ErrorKind::InvalidInput.into());
    }
    let mut mask = [0 as c_ulong; MAX_PIN_CPU / BITS];
    mask[cpu / BITS] |= 1 << (cpu % BITS);
    // SAFETY: `mask` is `size_of_val(&mask)` readable bytes; pid 0 is the
    // calling thread (the init is single-threaded when it pins).
    let r = unsafe { sched_setaffinity(0, core::mem::size_of_val(&mask), mask.as_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// fork(): `Some(0)` in the child, `Some(pid)` in the parent.
pub fn fork_process() -> std::io::Result<i32> {
    // SAFETY: the init forks while single-threaded (process mode only).
    let pid = unsafe { fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(pid)
}

/// Ends a forked child at once (no atexit handlers, no stdio flush).
pub fn exit_child(status: i32) -> ! {
    // SAFETY: _exit never returns.
    unsafe { _exit(status) }
}

/// Waits for any child; `None` when there is none left.
pub fn wait_any() -> Option<(i32, i32)> {
    let mut status = 0;
    // SAFETY: `status` is a valid int.
    let pid = unsafe { waitpid(-1, &mut status, 0) };
    (pid > 0).then_some((pid, status))
}

/// A pipe (`[read, write]`).
pub fn make_pipe() -> std::io::Result<[i32; 2]> {
    let mut fds = [0; 2];
    // SAFETY: `fds` holds two ints.
    if unsafe { pipe(fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fds)
}

/// An AF_UNIX SOCK_STREAM socket pair (as perf bench's default).
pub fn make_socketpair() -> std::io::Result<[i32; 2]> {
    let mut fds = [0; 2];
    // SAFETY: `fds` holds two ints.
    if unsafe { socketpair(1, 1, 0, fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fds)
}

/// read(2), retried on EINTR.
pub fn read_fd(fd: i32, buf: &mut [u8]) -> isize {
    loop {
        // SAFETY: `buf` is valid for its length.
        let n = unsafe { read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return n;
        }
    }
}

/// write(2) of the whole buffer, retried on EINTR and short writes.
pub fn write_all_fd(fd: i32, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for its length.
        let n = unsafe { write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        buf = &buf[n as usize..];
    }
    true
}

/// close(2).
pub fn close_fd(fd: i32) {
    // SAFETY: closing a descriptor this process owns.
    unsafe { close(fd) };
}
