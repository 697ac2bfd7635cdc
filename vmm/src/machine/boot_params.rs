//! Writing the PVH boot structures into guest memory: the command line,
//! the E820 map and `hvm_start_info` (linux-loader's PVH configurator).

use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::start_info::{hvm_memmap_table_entry, hvm_start_info};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::machine::memory::{MemoryLayout, CMDLINE_ADDR, MEMMAP_ADDR, START_INFO_ADDR};

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
}

/// Writes the command line, the E820 map and `hvm_start_info`.
pub fn write_boot_params(
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    cmdline: &str,
) -> Result<(), BootParamsError> {
    // The caller validated length and contents (crate::spec::cmdline::validate).
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))
        .map_err(BootParamsError::Cmdline)?;

    let memmap: Vec<hvm_memmap_table_entry> = layout
        .e820()
        .iter()
        .map(|e| hvm_memmap_table_entry {
            addr: e.addr,
            size: e.size,
            type_: e.kind,
            reserved: 0,
        })
        .collect();
    let start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        // Version 1: the memmap fields are valid.
        version: 1,
        cmdline_paddr: CMDLINE_ADDR,
        memmap_paddr: MEMMAP_ADDR,
        memmap_entries: memmap.len() as u32,
        ..Default::default()
    };
    let mut params = BootParams::new(&start_info, GuestAddress(START_INFO_ADDR));
    params.set_sections(&memmap, GuestAddress(MEMMAP_ADDR));
    PvhBootConfigurator::write_bootparams(&params, mem).map_err(BootParamsError::Pvh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_params_land_where_the_guest_looks() {
        let layout = MemoryLayout::new(32).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        write_boot_params(&mem, &layout, "pti=on telemetry=0x1fff000").unwrap();
        let si: hvm_start_info = mem.read_obj(GuestAddress(START_INFO_ADDR)).unwrap();
        assert_eq!(si.magic, XEN_HVM_START_MAGIC);
        assert_eq!(si.cmdline_paddr, CMDLINE_ADDR);
        assert_eq!(si.memmap_entries, 3);
        let e: hvm_memmap_table_entry = mem.read_obj(GuestAddress(MEMMAP_ADDR + 2 * 24)).unwrap();
        assert_eq!((e.addr, e.size, e.type_), (0x1fff000, 0x1000, 2));
        let mut buf = [0u8; 27];
        mem.read_slice(&mut buf, GuestAddress(CMDLINE_ADDR))
            .unwrap();
        assert_eq!(&buf, b"pti=on telemetry=0x1fff000\0");
    }
}
