//! Writing the PVH boot structures into guest memory: the command line,
//! the E820 map and `hvm_start_info` (linux-loader's PVH configurator);
//! for a Linux guest (a PVH vmlinux) also its initramfs, as the first PVH
//! module (Linux's `init_pvh_bootparams` makes it the ramdisk), and the
//! RSDP of the ACPI tables `crate::machine::acpi` wrote.

use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::machine::acpi;
use crate::machine::memory::{
    MemoryLayout, CMDLINE_ADDR, MEMMAP_ADDR, MODLIST_ADDR, START_INFO_ADDR,
};

const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;

/// Errors writing the boot structures.
#[derive(Debug, thiserror::Error)]
pub enum BootParamsError {
    /// The command line could not be written to guest memory.
    #[error("writing the guest command line: {0}")]
    Cmdline(#[source] vm_memory::GuestMemoryError),
    /// hvm_start_info or the E820 map could not be written.
    #[error("writing hvm_start_info and the memory map: {0}")]
    Pvh(#[source] linux_loader::configurator::Error),
    /// The initramfs does not fit between the kernel and the end of RAM.
    #[error(
        "the initrd ({size} bytes) does not fit between the kernel's end {kernel_end:#x} and \
         the end of usable RAM {ram_end:#x}: give a larger --mem"
    )]
    InitrdTooBig {
        /// The initrd's size.
        size: usize,
        /// One past the kernel's last byte.
        kernel_end: u64,
        /// The end of usable RAM.
        ram_end: u64,
    },
    /// The ACPI tables could not be written.
    #[error("writing the ACPI tables: {0}")]
    Acpi(#[source] acpi::AcpiError),
    /// The initramfs could not be written to guest memory.
    #[error("writing the initrd: {0}")]
    Initrd(#[source] vm_memory::GuestMemoryError),
}

/// What a Linux guest booted by PVH gets beyond the companion's structures.
#[derive(Debug, Clone, Copy)]
pub struct PvhLinux<'a> {
    /// Its initramfs (ptiscope's init), the first PVH module.
    pub initrd: Option<&'a [u8]>,
    /// One past the kernel's last byte: the initrd goes above it.
    pub kernel_end: u64,
    /// The RSDP of the ACPI tables already written (`acpi::write_tables`),
    /// whose area the E820 map then reserves.
    pub rsdp: u64,
}

/// Writes the command line, the E820 map and `hvm_start_info`.
pub fn write_boot_params(
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    cmdline: &str,
    linux: Option<&PvhLinux>,
) -> Result<(), BootParamsError> {
    // The caller validated length and contents (crate::spec::cmdline::validate).
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))
        .map_err(BootParamsError::Cmdline)?;

    let mut e820 = layout.e820().to_vec();
    if linux.is_some() {
        e820.push(acpi::e820_entry());
        e820.sort_by_key(|e| e.addr);
    }
    let memmap: Vec<hvm_memmap_table_entry> = e820
        .iter()
        .map(|e| hvm_memmap_table_entry {
            addr: e.addr,
            size: e.size,
            type_: e.kind,
            reserved: 0,
        })
        .collect();
    // The initramfs at the top of usable RAM (below the telemetry page),
    // page-aligned, above the kernel.
    let module = match linux.and_then(|l| l.initrd.map(|rd| (l, rd))) {
        Some((l, rd)) => {
            let ram_end = layout.telemetry_addr();
            let too_big = BootParamsError::InitrdTooBig {
                size: rd.len(),
                kernel_end: l.kernel_end,
                ram_end,
            };
            let addr = layout
                .initrd_address(rd.len() as u64, l.kernel_end, ram_end)
                .ok_or(too_big)?;
            mem.write_slice(rd, GuestAddress(addr))
                .map_err(BootParamsError::Initrd)?;
            Some(hvm_modlist_entry {
                paddr: addr,
                size: rd.len() as u64,
                ..Default::default()
            })
        }
        None => None,
    };
    let start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        // Version 1: the memmap fields are valid.
        version: 1,
        cmdline_paddr: CMDLINE_ADDR,
        memmap_paddr: MEMMAP_ADDR,
        memmap_entries: memmap.len() as u32,
        nr_modules: u32::from(module.is_some()),
        modlist_paddr: if module.is_some() { MODLIST_ADDR } else { 0 },
        rsdp_paddr: linux.map_or(0, |l| l.rsdp),
        ..Default::default()
    };
    let mut params = BootParams::new(&start_info, GuestAddress(START_INFO_ADDR));
    params.set_sections(&memmap, GuestAddress(MEMMAP_ADDR));
    if let Some(m) = &module {
        params.set_modules(std::slice::from_ref(m), GuestAddress(MODLIST_ADDR));
    }
    PvhBootConfigurator::write_bootparams(&params, mem).map_err(BootParamsError::Pvh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_params_land_where_the_guest_looks() {
        let layout = MemoryLayout::new(32).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        write_boot_params(&mem, &layout, "pti=on telemetry=0x1fff000", None).unwrap();
        let si: hvm_start_info = mem.read_obj(GuestAddress(START_INFO_ADDR)).unwrap();
        assert_eq!(si.magic, XEN_HVM_START_MAGIC);
        // The companion gets no module and no ACPI.
        assert_eq!((si.nr_modules, si.modlist_paddr, si.rsdp_paddr), (0, 0, 0));
        assert_eq!(si.cmdline_paddr, CMDLINE_ADDR);
        assert_eq!(si.memmap_entries, 3);
        let e: hvm_memmap_table_entry = mem.read_obj(GuestAddress(MEMMAP_ADDR + 2 * 24)).unwrap();
        assert_eq!((e.addr, e.size, e.type_), (0x1fff000, 0x1000, 2));
        let mut buf = [0u8; 27];
        mem.read_slice(&mut buf, GuestAddress(CMDLINE_ADDR))
            .unwrap();
        assert_eq!(&buf, b"pti=on telemetry=0x1fff000\0");
    }

    #[test]
    fn a_linux_guest_gets_its_initramfs_as_the_first_module_and_the_rsdp() {
        let layout = MemoryLayout::new(32).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        let rd = vec![0x5a_u8; 5000];
        let linux = PvhLinux {
            initrd: Some(&rd),
            kernel_end: 0x40_0000,
            rsdp: 0xe_0000,
        };
        write_boot_params(&mem, &layout, "console=ttyS0", Some(&linux)).unwrap();
        let si: hvm_start_info = mem.read_obj(GuestAddress(START_INFO_ADDR)).unwrap();
        assert_eq!((si.nr_modules, si.modlist_paddr), (1, MODLIST_ADDR));
        assert_eq!(si.rsdp_paddr, 0xe_0000);
        // The ACPI area is reserved: four entries, in address order.
        assert_eq!(si.memmap_entries, 4);
        let m: hvm_modlist_entry = mem.read_obj(GuestAddress(MODLIST_ADDR)).unwrap();
        assert_eq!(m.size, 5000);
        assert_eq!(m.paddr % 0x1000, 0);
        assert!(m.paddr >= 0x40_0000 && m.paddr + m.size <= layout.telemetry_addr());
        let mut back = vec![0u8; 5000];
        mem.read_slice(&mut back, GuestAddress(m.paddr)).unwrap();
        assert_eq!(back, rd);
        // Too big for the RAM above the kernel: refused, naming --mem.
        let huge = vec![0u8; 31 << 20];
        let err = write_boot_params(
            &mem,
            &layout,
            "console=ttyS0",
            Some(&PvhLinux {
                initrd: Some(&huge),
                ..linux
            }),
        )
        .unwrap_err();
        assert!(matches!(err, BootParamsError::InitrdTooBig { .. }), "{err}");
        assert!(err.to_string().contains("--mem"), "{err}");
    }
}
