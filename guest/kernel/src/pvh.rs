//! The PVH `hvm_start_info` handed over in `ebx` (Xen's arch-x86/hvm/start_info.h).
use crate::arch::layout::phys_to_virt;
use crate::sync::TakeOnce;
use guest_core::memmap::MemRegion;

const MAGIC: u32 = 0x336e_c578;
/// Bytes of command line we read at most (the VMM's limit too).
const CMDLINE_MAX: usize = 4096;
/// Memory-map entries we read at most.
pub const MEMMAP_MAX: usize = 32;

#[repr(C)]
#[derive(Clone, Copy)]
struct RawStartInfo {
    magic: u32,
    version: u32,
    flags: u32,
    nr_modules: u32,
    modlist_paddr: u64,
    cmdline_paddr: u64,
    rsdp_paddr: u64,
    memmap_paddr: u64,
    memmap_entries: u32,
    reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RawMemmapEntry {
    addr: u64,
    size: u64,
    kind: u32,
    reserved: u32,
}

pub struct StartInfo {
    pub cmdline: &'static str,
    pub memmap: &'static [MemRegion],
}

const NO_REGION: MemRegion = MemRegion {
    base: 0,
    size: 0,
    kind: 0,
};
/// The memory map as read, in .bss: neither zeroed on the stack nor moved
/// with the `StartInfo` (each emulated instruction counts on kvm_pvm).
/// Filled once, by kmain's one read of the start info, then only read.
static MEMMAP: TakeOnce<[MemRegion; MEMMAP_MAX]> = TakeOnce::new([NO_REGION; MEMMAP_MAX]);

#[derive(Debug)]
pub enum StartInfoError {
    Unreachable(u64),
    BadMagic(u32),
    CmdlineNotUtf8,
}

impl core::fmt::Display for StartInfoError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StartInfoError::Unreachable(a) => write!(f, "address {a:#x} is outside the direct map"),
            StartInfoError::BadMagic(m) => {
                write!(f, "hvm_start_info magic is {m:#x}, expected {MAGIC:#x}")
            }
            StartInfoError::CmdlineNotUtf8 => write!(f, "command line is not UTF-8"),
        }
    }
}

/// Reads a `T` at guest-physical `phys` through the direct map.
fn read_phys<T: Copy>(phys: u64) -> Result<T, StartInfoError> {
    let end = phys
        .checked_add(core::mem::size_of::<T>() as u64)
        .ok_or(StartInfoError::Unreachable(phys))?;
    let v = phys_to_virt(phys).ok_or(StartInfoError::Unreachable(phys))?;
    phys_to_virt(end).ok_or(StartInfoError::Unreachable(end))?;
    // SAFETY: the direct map covers [phys, end) (checked above) with RAM or
    // zero-filled gaps; the read is unaligned-safe and of plain data.
    Ok(unsafe { core::ptr::read_unaligned(v as usize as *const T) })
}

/// The length of the NUL-terminated string at the start of `bytes` (all
/// of `bytes` if it has no NUL): one `repne scasb`, where a byte loop costs
/// four emulated instructions per byte on software-KVM hosts.
fn nul_len(bytes: &[u8]) -> usize {
    let len = bytes.len();
    let left: usize;
    // SAFETY: reads `bytes` only (DF is clear in kernel code).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("repne scasb", in("al") 0u8, inout("rdi") bytes.as_ptr() => _,
                         inout("rcx") len => left, options(nostack, readonly))
    };
    // SAFETY: as above.
    #[cfg(target_arch = "x86")]
    unsafe {
        core::arch::asm!("repne scasb", in("al") 0u8, inout("edi") bytes.as_ptr() => _,
                         inout("ecx") len => left, options(nostack, readonly))
    };
    // The scan stopped after byte `len - left - 1`: the NUL, or the last.
    match (len - left).checked_sub(1) {
        Some(last) if bytes[last] == 0 => last,
        _ => len,
    }
}

impl StartInfo {
    /// Parses the structure at `phys`. Bounds are checked: the VMM is trusted
    /// to hand over sane data, but a broken one must not crash us silently.
    pub fn read(phys: u64) -> Result<StartInfo, StartInfoError> {
        let raw: RawStartInfo = read_phys(phys)?;
        if raw.magic != MAGIC {
            return Err(StartInfoError::BadMagic(raw.magic));
        }
        let cmdline = if raw.cmdline_paddr == 0 {
            ""
        } else {
            let base = raw.cmdline_paddr;
            let v = phys_to_virt(base).ok_or(StartInfoError::Unreachable(base))?;
            phys_to_virt(base + CMDLINE_MAX as u64).ok_or(StartInfoError::Unreachable(base))?;
            // SAFETY: [base, base + CMDLINE_MAX) is in the direct map (checked).
            let bytes =
                unsafe { core::slice::from_raw_parts(v as usize as *const u8, CMDLINE_MAX) };
            let bytes = &bytes[..nul_len(bytes)];
            if bytes.is_ascii() {
                // SAFETY: ASCII is UTF-8.
                unsafe { core::str::from_utf8_unchecked(bytes) }
            } else {
                core::str::from_utf8(bytes).map_err(|_| StartInfoError::CmdlineNotUtf8)?
            }
        };
        let Some(memmap) = MEMMAP.take() else {
            panic!("the hvm_start_info is read once, at boot")
        };
        let mut memmap_len = 0;
        if raw.version >= 1 && raw.memmap_paddr != 0 && raw.memmap_entries != 0 {
            let n = (raw.memmap_entries as usize).min(MEMMAP_MAX);
            // The table's bounds checked once, not per entry.
            let table = raw.memmap_paddr;
            let size = (n * core::mem::size_of::<RawMemmapEntry>()) as u64;
            let end = table
                .checked_add(size)
                .ok_or(StartInfoError::Unreachable(table))?;
            let v = phys_to_virt(table).ok_or(StartInfoError::Unreachable(table))?;
            phys_to_virt(end).ok_or(StartInfoError::Unreachable(end))?;
            let entries = v as usize as *const RawMemmapEntry;
            for (i, slot) in memmap[..n].iter_mut().enumerate() {
                // SAFETY: entry i < n lies in [table, end), which the
                // direct map covers (checked above); plain data, read
                // unaligned.
                let e = unsafe { entries.add(i).read_unaligned() };
                *slot = MemRegion {
                    base: e.addr,
                    size: e.size,
                    kind: e.kind,
                };
            }
            memmap_len = n;
        }
        Ok(StartInfo {
            cmdline,
            memmap: &memmap[..memmap_len],
        })
    }

    pub fn memmap(&self) -> &'static [MemRegion] {
        self.memmap
    }
}
