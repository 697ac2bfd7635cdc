//! Booting a Linux bzImage (the Linux/x86 64-bit and 32-bit boot
//! protocols, Documentation/arch/x86/boot.rst): linux-loader's
//! `BzImage::load` copies the protected-mode kernel to 1 MiB, this module
//! writes `boot_params` (the image's setup header, the VMM's E820 map, the
//! command line, an optional initrd) and a flat GDT, and
//! [`crate::machine::cpu_config`] starts the vCPU with `rsi` =
//! `boot_params`. A 64-bit kernel (xloadflags XLF_KERNEL_64) enters at
//! load address + 0x200 in long mode on identity page tables for the first
//! GiB, which this module writes too; an i386 kernel (no 64-bit entry)
//! enters at `code32_start`, the load address, in 32-bit flat protected
//! mode with paging off, and turns on PAE paging itself (a KVM that
//! refuses paging outside long mode, kvm_pvm, cannot run it: preflight
//! says so from the probe).
//!
//! Everything the image says (setup size, protocol version, flags, sizes) is
//! hostile input: checked against the image and the memory layout before a
//! byte is copied; [`check_lengths`] (the file against its own header) is
//! also what `--linux` checks before either backend boots a bzImage.
//!
//! Size: the header checks and their typed errors, `boot_params`, the boot
//! GDT and page tables; about 150 lines are tests of hostile headers.

use std::io::Cursor;

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::bzimage::BzImage;
use linux_loader::loader::KernelLoader;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::machine::acpi::{self, AcpiTables};
use crate::machine::memory::{MemoryLayout, CMDLINE_ADDR, CMDLINE_MAX, HIGH_RAM_START};

/// The flat GDT of the boot protocols (null, null, `__BOOT_CS`, `__BOOT_DS`, TSS).
pub const GDT_ADDR: u64 = 0x500;
/// `struct boot_params` (the "zero page").
pub const ZERO_PAGE_ADDR: u64 = 0x8000;
/// Identity page tables: PML4, PDPT, and one PD of 2 MiB pages (1 GiB).
pub const PML4_ADDR: u64 = 0x9000;
const PDPT_ADDR: u64 = 0xa000;
const PD_ADDR: u64 = 0xb000;
/// The selectors the 64-bit and 32-bit boot protocols require.
pub const BOOT_CS: u16 = 0x10;
/// `__BOOT_DS`.
pub const BOOT_DS: u16 = 0x18;
/// The TSS selector of the boot GDT.
pub const BOOT_TSS: u16 = 0x20;
/// Entries in the boot GDT (the 64-bit TSS descriptor takes two).
const GDT_ENTRIES: usize = 6;

const _: () = assert!(GDT_ADDR + 8 * GDT_ENTRIES as u64 <= ZERO_PAGE_ADDR);
const _: () = assert!(ZERO_PAGE_ADDR + 4096 <= PML4_ADDR);
const _: () = assert!(PD_ADDR + 4096 <= CMDLINE_ADDR);

/// The setup header's `header` field: "HdrS".
pub const HDRS_MAGIC: u32 = 0x5372_6448;
/// The setup header's `boot_flag`: the boot sector's 0x55 0xaa.
pub const BOOT_FLAG: u16 = 0xaa55;
/// Where the setup header starts in the image.
pub const SETUP_HEADER_OFFSET: usize = 0x1f1;
/// Boot protocol 2.12: `xloadflags` (XLF_KERNEL_64) exists.
pub const MIN_PROTOCOL: u16 = 0x020c;
/// `xloadflags` bit 0: the kernel has a 64-bit entry point at 0x200.
pub const XLF_KERNEL_64: u16 = 1;
const LOADFLAGS_LOADED_HIGH: u8 = 1;
const LOADFLAGS_CAN_USE_HEAP: u8 = 0x80;
/// `type_of_loader` 0xff: a boot loader without an assigned ID.
const LOADER_UNDEFINED: u8 = 0xff;
/// Offset of the 64-bit entry from the load address.
const ENTRY_64_OFFSET: u64 = 0x200;
const E820_MAX_ZEROPAGE: usize = 128;

/// Errors loading a bzImage.
#[derive(Debug, thiserror::Error)]
pub enum BzImageError {
    /// Too short to hold a setup header.
    #[error("truncated: {0} bytes are too short for a bzImage setup header")]
    TooShort(usize),
    /// A boot protocol before 2.12.
    #[error("bzImage boot protocol {0:#x} is older than 2.12 (Linux 3.8)")]
    OldProtocol(u16),
    /// `loadflags` lacks LOADED_HIGH (a zImage).
    #[error("the image is a zImage (loadflags bit 0 clear), not a bzImage")]
    NotLoadedHigh,
    /// The setup sectors reach past the end of the file.
    #[error("setup_sects {setup_sects} says the kernel starts at {offset:#x}, past the file's {len} bytes")]
    SetupPastEnd {
        /// The header's `setup_sects`.
        setup_sects: u8,
        /// Where the protected-mode kernel would start.
        offset: usize,
        /// The file length.
        len: usize,
    },
    /// `setup_sects` beyond what any Linux build writes.
    #[error(
        "setup_sects {0} is not a bzImage's: Linux's real-mode setup is at most \
         {MAX_SETUP_SECTS} sectors (the header is corrupt or this is not a Linux kernel)"
    )]
    AbsurdSetup(u8),
    /// `syssize` 0: no protected-mode kernel.
    #[error("syssize is 0: the header says there is no protected-mode kernel after the setup")]
    NoKernel,
    /// The file is shorter than its header says.
    #[error(
        "truncated: the header says {need} bytes (setup {setup:#x} + syssize {kernel:#x}), \
         the file has {len}; the image was cut short (an interrupted copy or download?)"
    )]
    Truncated {
        /// Bytes the header says the image has.
        need: u64,
        /// The setup part (boot sector and real-mode setup).
        setup: u64,
        /// The protected-mode kernel (`syssize` × 16).
        kernel: u64,
        /// The file's length.
        len: usize,
    },
    /// The compressed payload lies outside the protected-mode kernel.
    #[error(
        "payload_offset {offset:#x} + payload_length {length:#x} lies past the protected-mode \
         kernel's {kernel:#x} bytes (syssize): the header is corrupt"
    )]
    PayloadOutside {
        /// `payload_offset`.
        offset: u32,
        /// `payload_length`.
        length: u32,
        /// The protected-mode kernel's size.
        kernel: u64,
    },
    /// The kernel (or the memory it decompresses into) does not fit in guest RAM.
    #[error(
        "the kernel needs {need:#x} bytes from {load:#x} (init_size and payload), past usable \
         guest RAM at {ram_end:#x}; give more --mem"
    )]
    TooBig {
        /// The load address.
        load: u64,
        /// Bytes needed from it.
        need: u64,
        /// End of usable RAM.
        ram_end: u64,
    },
    /// The initrd does not fit between the kernel and the end of RAM (or the image's `initrd_addr_max`).
    #[error(
        "the initrd ({size} bytes) does not fit between the kernel's end {kernel_end:#x} and \
         {limit:#x}; give more --mem"
    )]
    InitrdTooBig {
        /// The initrd's size.
        size: usize,
        /// First byte past the kernel's decompression area.
        kernel_end: u64,
        /// Highest address it may reach.
        limit: u64,
    },
    /// The command line is longer than the image accepts (`cmdline_size`).
    #[error("the kernel command line is {len} bytes; this kernel accepts at most {max}")]
    CmdlineTooLong {
        /// The command line's length.
        len: usize,
        /// The image's limit.
        max: usize,
    },
    /// The ACPI tables could not be written.
    #[error("{0}")]
    Acpi(#[source] acpi::AcpiError),
    /// linux-loader refused the image.
    #[error("{0}")]
    Loader(#[source] linux_loader::loader::Error),
    /// Writing the boot structures or the initrd failed.
    #[error("writing {0} to guest memory: {1}")]
    Write(&'static str, #[source] vm_memory::GuestMemoryError),
}

/// Whether `image` starts like a bzImage (boot sector signature and "HdrS").
pub fn is_bzimage(image: &[u8]) -> bool {
    image.get(0x1fe..0x200) == Some(&[0x55, 0xaa]) && image.get(0x202..0x206) == Some(b"HdrS")
}

/// Which boot protocol a bzImage is entered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootMode {
    /// The 64-bit protocol (xloadflags XLF_KERNEL_64): long mode at load + 0x200.
    Long64,
    /// The 32-bit protocol (an i386 kernel): flat protected mode, paging
    /// off, at `code32_start` (the load address).
    Protected32,
}

/// A loaded bzImage: what the vCPU and `boot_params` need.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadedBzImage {
    /// The setup header as linux-loader read it (code32_start = load address).
    pub header: setup_header,
    /// Where the protected-mode kernel was loaded.
    pub load_addr: u64,
    /// The entry: load address + 0x200 (64-bit), the load address (32-bit).
    pub entry: u64,
    /// The protocol `entry` expects.
    pub mode: BootMode,
    /// First byte past the kernel's decompression area (load + init_size).
    pub end: u64,
}

/// The image's setup header as the bytes say (any bytes are a value:
/// check `header` against [`HDRS_MAGIC`]); `None` if the image is too short
/// to hold one. `preflight::linux::image` recognises kernels with it too.
pub fn setup_header_of(image: &[u8]) -> Option<setup_header> {
    let size = std::mem::size_of::<setup_header>();
    let bytes = image.get(SETUP_HEADER_OFFSET..SETUP_HEADER_OFFSET + size)?;
    let mut hdr = setup_header::default();
    // setup_header is plain old data (ByteValued): any bytes are a value.
    vm_memory::ByteValued::as_mut_slice(&mut hdr).copy_from_slice(bytes);
    Some(hdr)
}

/// Most real-mode setup sectors a Linux build writes
/// (`arch/x86/boot/tools/build.c`'s `SETUP_SECT_MAX`).
pub const MAX_SETUP_SECTS: u8 = 64;
/// Boot protocol 2.08: `payload_offset` and `payload_length` exist.
const PAYLOAD_PROTOCOL: u16 = 0x0208;

/// Checks a bzImage's lengths against its own header before anything
/// boots (either backend): `setup_sects` (0 means 4) within what Linux
/// writes, `syssize` (16-byte units, a 32-bit field since protocol 2.04)
/// not 0, the file at least setup + syssize long (a signed kernel may be
/// longer: the signature is appended), and the compressed payload inside
/// the protected-mode kernel. A truncated image otherwise starts and
/// triple-faults inside the decompressor, or waits for the timeout.
pub fn check_lengths(hdr: &setup_header, len: usize) -> Result<(), BzImageError> {
    if hdr.setup_sects > MAX_SETUP_SECTS {
        return Err(BzImageError::AbsurdSetup(hdr.setup_sects));
    }
    let sects = if hdr.setup_sects == 0 {
        4
    } else {
        hdr.setup_sects
    };
    let setup = (u64::from(sects) + 1) * 512;
    let kernel = u64::from(hdr.syssize) * 16;
    if kernel == 0 {
        return Err(BzImageError::NoKernel);
    }
    let need = setup + kernel;
    if (len as u64) < need {
        return Err(BzImageError::Truncated {
            need,
            setup,
            kernel,
            len,
        });
    }
    let version = hdr.version;
    if version >= PAYLOAD_PROTOCOL {
        let (offset, length) = (hdr.payload_offset, hdr.payload_length);
        if length == 0 || u64::from(offset) + u64::from(length) > kernel {
            return Err(BzImageError::PayloadOutside {
                offset,
                length,
                kernel,
            });
        }
    }
    Ok(())
}

fn header_of(image: &[u8]) -> Result<setup_header, BzImageError> {
    setup_header_of(image).ok_or(BzImageError::TooShort(image.len()))
}

/// Checks the image's header against the image and `layout`, then loads it
/// with linux-loader at 1 MiB.
pub fn load(
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    image: &[u8],
) -> Result<LoadedBzImage, BzImageError> {
    let hdr = header_of(image)?;
    if { hdr.header } != HDRS_MAGIC {
        return Err(BzImageError::TooShort(image.len()));
    }
    let version = hdr.version;
    if version < MIN_PROTOCOL {
        return Err(BzImageError::OldProtocol(version));
    }
    let mode = if hdr.xloadflags & XLF_KERNEL_64 != 0 {
        BootMode::Long64
    } else {
        BootMode::Protected32
    };
    if hdr.loadflags & LOADFLAGS_LOADED_HIGH == 0 {
        return Err(BzImageError::NotLoadedHigh);
    }
    check_lengths(&hdr, image.len())?;
    let sects = if hdr.setup_sects == 0 {
        4
    } else {
        hdr.setup_sects
    };
    let offset = (usize::from(sects) + 1) * 512;
    if offset >= image.len() {
        return Err(BzImageError::SetupPastEnd {
            setup_sects: hdr.setup_sects,
            offset,
            len: image.len(),
        });
    }
    let load = HIGH_RAM_START;
    let payload = (image.len() - offset) as u64;
    let need = payload.max(u64::from(hdr.init_size));
    let ram_end = layout.telemetry_addr();
    if load + need > ram_end {
        return Err(BzImageError::TooBig {
            load,
            need,
            ram_end,
        });
    }
    // Always at 1 MiB, whatever code32_start says (a relocatable kernel
    // moves itself; the header's address is not trusted).
    let result = BzImage::load(mem, Some(GuestAddress(load)), &mut Cursor::new(image), None)
        .map_err(BzImageError::Loader)?;
    let header = result.setup_header.unwrap_or(hdr);
    // The 32-bit protocol enters at code32_start, which linux-loader set
    // to the load address.
    let entry = match mode {
        BootMode::Long64 => load + ENTRY_64_OFFSET,
        BootMode::Protected32 => load,
    };
    Ok(LoadedBzImage {
        header,
        load_addr: load,
        entry,
        mode,
        end: load + need,
    })
}

/// Writes the command line, the initrd (at the top of usable RAM), the boot
/// GDT, `boot_params` and, for the 64-bit protocol, the identity page tables.
/// With `acpi` (tables [`crate::machine::acpi`] wrote), `boot_params` points
/// at their RSDP and the E820 map reserves their area.
pub fn write_boot_params(
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    kernel: &LoadedBzImage,
    cmdline: &str,
    initrd: Option<&[u8]>,
    acpi: Option<&AcpiTables>,
) -> Result<(), BzImageError> {
    let mut hdr = kernel.header;
    // cmdline_size excludes the NUL; the VMM's own limit applies too.
    let max = (hdr.cmdline_size as usize).min(CMDLINE_MAX - 1);
    if cmdline.len() > max {
        return Err(BzImageError::CmdlineTooLong {
            len: cmdline.len(),
            max,
        });
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))
        .map_err(|e| BzImageError::Write("the command line", e))?;

    hdr.type_of_loader = LOADER_UNDEFINED;
    hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    hdr.loadflags |= LOADFLAGS_CAN_USE_HEAP;
    // The heap ends below the boot GDT's page, as a boot loader's would
    // (offset from the real-mode code; the 64-bit and 32-bit entries ignore it).
    hdr.heap_end_ptr = 0xfe00;
    if let Some(rd) = initrd {
        let ram_end = layout.telemetry_addr();
        let limit = match hdr.initrd_addr_max {
            0 => ram_end,
            m => ram_end.min(u64::from(m) + 1),
        };
        let addr = layout
            .initrd_address(rd.len() as u64, kernel.end, limit)
            .ok_or(BzImageError::InitrdTooBig {
                size: rd.len(),
                kernel_end: kernel.end,
                limit,
            })?;
        mem.write_slice(rd, GuestAddress(addr))
            .map_err(|e| BzImageError::Write("the initrd", e))?;
        hdr.ramdisk_image = addr as u32;
        hdr.ramdisk_size = rd.len() as u32;
    }

    let mut params = boot_params {
        hdr,
        ..Default::default()
    };
    let mut e820 = layout.e820().to_vec();
    if let Some(t) = acpi {
        // Boot protocol 2.14+ reads it here; older kernels find the RSDP
        // by scanning 0xe0000-0xfffff, where it is too.
        params.acpi_rsdp_addr = t.rsdp;
        e820.push(acpi::e820_entry());
        e820.sort_by_key(|e| e.addr);
    }
    for (slot, e) in params.e820_table.iter_mut().zip(e820.iter()) {
        *slot = boot_e820_entry {
            addr: e.addr,
            size: e.size,
            r#type: e.kind,
        };
    }
    const _: () = assert!(4 <= E820_MAX_ZEROPAGE);
    params.e820_entries = e820.len() as u8;
    mem.write_obj(params, GuestAddress(ZERO_PAGE_ADDR))
        .map_err(|e| BzImageError::Write("boot_params", e))?;

    write_gdt(mem, kernel.mode)?;
    match kernel.mode {
        BootMode::Long64 => write_identity_page_tables(mem),
        // Paging is off at the 32-bit entry: the kernel builds its own.
        BootMode::Protected32 => Ok(()),
    }
}

/// The boot GDT: `__BOOT_CS` (64-bit code, or flat 32-bit code for the
/// 32-bit protocol), `__BOOT_DS` (flat data) and a busy TSS descriptor,
/// matching [`crate::machine::cpu_config`]'s segments (a reload of any of
/// them by the kernel's early code changes nothing).
fn write_gdt(mem: &GuestMemoryMmap, mode: BootMode) -> Result<(), BzImageError> {
    let code = match mode {
        BootMode::Long64 => 0x00af_9b00_0000_ffff, // L=1, present, DPL 0
        BootMode::Protected32 => 0x00cf_9b00_0000_ffff, // D=1, 4 GiB, execute/read
    };
    // The same TSS type (0xb) is "busy 64-bit" in long mode and "busy
    // 32-bit" outside it; the 64-bit descriptor's upper half (base bits
    // 63:32) is 0, which is also a null descriptor for the 32-bit GDT.
    let gdt: [u64; GDT_ENTRIES] = [
        0,
        0,
        code,                  // 0x10: __BOOT_CS
        0x00cf_9300_0000_ffff, // 0x18: __BOOT_DS, data, 4 GiB, read/write
        0x0000_8b00_0000_0067, // 0x20: busy TSS at 0, limit 0x67
        0,
    ];
    for (i, d) in gdt.iter().enumerate() {
        mem.write_obj(*d, GuestAddress(GDT_ADDR + 8 * i as u64))
            .map_err(|e| BzImageError::Write("the boot GDT", e))?;
    }
    Ok(())
}

/// The GDT's limit for GDTR.
pub const GDT_LIMIT: u16 = (8 * GDT_ENTRIES - 1) as u16;

/// PML4[0] -> PDPT[0] -> PD: 512 2 MiB pages, the first GiB identity-mapped
/// (the 64-bit boot protocol: the kernel and boot_params identity-mapped).
fn write_identity_page_tables(mem: &GuestMemoryMmap) -> Result<(), BzImageError> {
    const PRESENT_RW: u64 = 0x3;
    const PS: u64 = 0x80;
    let w = |v: u64, a: u64| {
        mem.write_obj(v, GuestAddress(a))
            .map_err(|e| BzImageError::Write("the identity page tables", e))
    };
    w(PDPT_ADDR | PRESENT_RW, PML4_ADDR)?;
    w(PD_ADDR | PRESENT_RW, PDPT_ADDR)?;
    for i in 0..512u64 {
        w((i << 21) | PRESENT_RW | PS, PD_ADDR + i * 8)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal 64-bit bzImage: 1 setup sector plus the boot sector, then a payload.
    fn image(payload: usize) -> Vec<u8> {
        let mut b = vec![0u8; 1024 + payload];
        b[0x1f1] = 1; // setup_sects
        b[0x1fe] = 0x55;
        b[0x1ff] = 0xaa;
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        b[0x211] = LOADFLAGS_LOADED_HIGH;
        b[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes()); // code32_start
        b[0x22c..0x230].copy_from_slice(&0x37ff_ffffu32.to_le_bytes()); // initrd_addr_max
        b[0x236..0x238].copy_from_slice(&XLF_KERNEL_64.to_le_bytes());
        b[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes()); // cmdline_size
        b[0x260..0x264].copy_from_slice(&0x40_0000u32.to_le_bytes()); // init_size
        let syssize = payload.div_ceil(16) as u32;
        b[0x1f4..0x1f8].copy_from_slice(&syssize.to_le_bytes());
        b[0x24c..0x250].copy_from_slice(&(payload as u32).to_le_bytes()); // payload_length
        b.resize(1024 + syssize as usize * 16, 0);
        b[1024] = 0xf4;
        b
    }

    #[test]
    fn loads_and_writes_boot_params() {
        let layout = MemoryLayout::new(32).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        let img = image(4096);
        assert!(is_bzimage(&img));
        let k = load(&mem, &layout, &img).unwrap();
        assert_eq!(
            (k.load_addr, k.entry, k.end),
            (0x10_0000, 0x10_0200, 0x50_0000)
        );
        let first: u8 = mem.read_obj(GuestAddress(0x10_0000)).unwrap();
        assert_eq!(first, 0xf4);
        write_boot_params(&mem, &layout, &k, "console=ttyS0", Some(&[7u8; 5000]), None).unwrap();
        let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        assert_eq!({ p.hdr.cmd_line_ptr }, CMDLINE_ADDR as u32);
        assert_eq!(p.hdr.type_of_loader, 0xff);
        assert_eq!(p.e820_entries, 3);
        let e1 = p.e820_table[1];
        assert_eq!(({ e1.addr }, { e1.r#type }), (HIGH_RAM_START, 1));
        let rd = { p.hdr.ramdisk_image } as u64;
        assert_eq!({ p.hdr.ramdisk_size }, 5000);
        assert!(rd >= k.end && rd + 5000 <= layout.telemetry_addr() && rd.is_multiple_of(4096));
        let byte: u8 = mem.read_obj(GuestAddress(rd)).unwrap();
        assert_eq!(byte, 7);
        let pde: u64 = mem.read_obj(GuestAddress(PD_ADDR + 8)).unwrap();
        assert_eq!(pde, 0x20_0083);
    }

    /// With ACPI tables, `boot_params` points at the RSDP and the E820 map
    /// reserves the tables' area, in order, apart from the RAM the kernel
    /// and the initrd take.
    #[test]
    fn acpi_tables_are_pointed_at_and_reserved() {
        let layout = MemoryLayout::new(32).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        let k = load(&mem, &layout, &image(4096)).unwrap();
        let t = acpi::write_tables(&mem, 2).unwrap();
        write_boot_params(&mem, &layout, &k, "", Some(&[7u8; 5000]), Some(&t)).unwrap();
        let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        assert_eq!({ p.acpi_rsdp_addr }, acpi::RSDP_ADDR);
        assert_eq!(p.e820_entries, 4);
        let map: Vec<(u64, u64, u32)> = p.e820_table[..4]
            .iter()
            .map(|e| ({ e.addr }, { e.size }, { e.r#type }))
            .collect();
        let a = acpi::e820_entry();
        assert_eq!(map[1], (a.addr, a.size, 2), "{map:x?}");
        assert!(
            map.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0),
            "{map:x?}"
        );
        assert!(a.addr <= t.rsdp && t.end <= a.end());
        let rd = u64::from(p.hdr.ramdisk_image);
        assert!(rd >= a.end() && k.load_addr >= a.end());
        // Without tables: no RSDP address, the three entries as before.
        write_boot_params(&mem, &layout, &k, "", None, None).unwrap();
        let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        assert_eq!(({ p.acpi_rsdp_addr }, p.e820_entries), (0, 3));
    }

    /// An i386 kernel (no XLF_KERNEL_64) is entered by the 32-bit protocol:
    /// at the load address, on a GDT whose `__BOOT_CS` is 32-bit code, with
    /// no page tables (paging is off at that entry).
    #[test]
    fn an_i386_bzimage_gets_the_32bit_entry_and_gdt() {
        let layout = MemoryLayout::new(32).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        let mut i386 = image(4096);
        i386[0x236] = 0;
        let k = load(&mem, &layout, &i386).unwrap();
        assert_eq!(
            (k.mode, k.load_addr, k.entry),
            (BootMode::Protected32, 0x10_0000, 0x10_0000)
        );
        write_boot_params(&mem, &layout, &k, "console=ttyS0", None, None).unwrap();
        let cs: u64 = mem.read_obj(GuestAddress(GDT_ADDR + 0x10)).unwrap();
        let ds: u64 = mem.read_obj(GuestAddress(GDT_ADDR + 0x18)).unwrap();
        assert_eq!((cs, ds), (0x00cf_9b00_0000_ffff, 0x00cf_9300_0000_ffff));
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_ADDR)).unwrap();
        assert_eq!(pml4, 0, "no identity page tables for the 32-bit entry");
        // The 64-bit image's __BOOT_CS is long-mode code.
        let k = load(&mem, &layout, &image(4096)).unwrap();
        assert_eq!(k.mode, BootMode::Long64);
        write_boot_params(&mem, &layout, &k, "", None, None).unwrap();
        let cs: u64 = mem.read_obj(GuestAddress(GDT_ADDR + 0x10)).unwrap();
        assert_eq!(cs, 0x00af_9b00_0000_ffff);
    }

    #[test]
    fn hostile_headers_are_typed_errors() {
        let layout = MemoryLayout::new(32).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        let mut old = image(16);
        old[0x206..0x208].copy_from_slice(&0x0204u16.to_le_bytes());
        assert!(matches!(
            load(&mem, &layout, &old),
            Err(BzImageError::OldProtocol(0x204))
        ));
        let mut past = image(16);
        past[0x1f1] = 60;
        assert!(matches!(
            load(&mem, &layout, &past),
            Err(BzImageError::Truncated { .. })
        ));
        past[0x1f1] = 200;
        assert!(matches!(
            load(&mem, &layout, &past),
            Err(BzImageError::AbsurdSetup(200))
        ));
        // Cut anywhere after the header: truncated, never loaded.
        let whole = image(4096);
        for len in [0x300, 1024, 1025, 3000, whole.len() - 1] {
            assert!(
                matches!(
                    load(&mem, &layout, &whole[..len]),
                    Err(BzImageError::Truncated { .. })
                ),
                "{len}"
            );
        }
        let mut huge = image(16);
        huge[0x260..0x264].copy_from_slice(&0xffff_0000u32.to_le_bytes());
        assert!(matches!(
            load(&mem, &layout, &huge),
            Err(BzImageError::TooBig { .. })
        ));
        assert!(matches!(
            load(&mem, &layout, &image(16)[..0x230]),
            Err(BzImageError::TooShort(_))
        ));
        let k = load(&mem, &layout, &image(16)).unwrap();
        let long = "x".repeat(2048);
        assert!(matches!(
            write_boot_params(&mem, &layout, &k, &long, None, None),
            Err(BzImageError::CmdlineTooLong { max: 2047, .. })
        ));
        let big = vec![0u8; 30 << 20];
        assert!(matches!(
            write_boot_params(&mem, &layout, &k, "", Some(&big), None),
            Err(BzImageError::InitrdTooBig { .. })
        ));
    }
}
