//! The tiny-VM harness: one VM with one vCPU and [`MEM_SIZE`] bytes of
//! anonymous RAM per probe, a run loop that records the probe's report
//! writes, and a watchdog so that no probe can hang.
//!
//! What a run reports ([`Stop`], [`Delivery`], [`Trace`]) is in `vm/trace.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvm_bindings::{
    kvm_msr_entry, kvm_regs, kvm_sregs, kvm_userspace_memory_region, CpuId, Msrs,
    KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{Kvm, MsrFilterRangeFlags, VcpuExit, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::code::{self, sel, Asm, HandlerExit, MEM_SIZE};
use crate::machine::segments::{set_flat, FlatSelectors};
use crate::signals::{kick, KickRegistration};

mod trace;
pub use trace::{Stop, Trace};

/// Setting up a probe VM failed (these are fatal for the whole probe).
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// /dev/kvm could not be opened.
    #[error("cannot open {path}: {source}")]
    OpenKvm {
        /// The device path.
        path: String,
        /// The open error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// KVM_GET_SUPPORTED_CPUID failed.
    #[error("KVM_GET_SUPPORTED_CPUID failed: {0}")]
    SupportedCpuid(#[source] kvm_ioctls::Error),
    /// KVM_CREATE_VM failed.
    #[error("KVM_CREATE_VM failed: {0}")]
    CreateVm(#[source] kvm_ioctls::Error),
    /// Guest memory could not be allocated.
    #[error("cannot allocate probe guest memory: {0}")]
    Memory(String),
    /// KVM_SET_USER_MEMORY_REGION failed.
    #[error("KVM_SET_USER_MEMORY_REGION failed: {0}")]
    SetMemory(#[source] kvm_ioctls::Error),
    /// KVM_CREATE_VCPU failed.
    #[error("KVM_CREATE_VCPU failed: {0}")]
    CreateVcpu(#[source] kvm_ioctls::Error),
    /// KVM_SET_CPUID2 failed.
    #[error("KVM_SET_CPUID2 failed: {0}")]
    SetCpuid(#[source] kvm_ioctls::Error),
    /// Setting or reading vCPU state failed.
    #[error("{what} failed: {source}")]
    VcpuState {
        /// The ioctl (`KVM_SET_SREGS`, ...).
        what: &'static str,
        /// Its error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Probe code could not be written to guest memory.
    #[error("cannot write probe code to guest memory: {0}")]
    WriteMemory(String),
    /// The vCPU kick signal handler could not be installed.
    #[error("cannot install the vCPU kick signal handler: {0}")]
    Kick(#[source] crate::signals::SignalError),
    /// KVM_RUN failed.
    #[error("KVM_RUN failed: {0}")]
    Run(#[source] kvm_ioctls::Error),
}

/// What the probes share: the KVM handle and the host's supported CPUID.
pub struct Kit {
    pub kvm: Kvm,
    pub cpuid: CpuId,
    pub timeout: Duration,
}

impl Kit {
    pub fn new(timeout: Duration) -> Result<Self, VmError> {
        // The same device node as the VMM's runs (PTISCOPE_KVM_DEVICE).
        let name = crate::machine::kvm::kvm_device_path();
        let open_err = |source| VmError::OpenKvm {
            path: name.clone(),
            source,
        };
        let path = std::ffi::CString::new(name.clone())
            .map_err(|_| open_err(kvm_ioctls::Error::new(libc::EINVAL)))?;
        let kvm = Kvm::new_with_path(&path).map_err(open_err)?;
        let cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(VmError::SupportedCpuid)?;
        Ok(Kit {
            kvm,
            cpuid,
            timeout,
        })
    }
}

/// How the vCPU starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartMode {
    /// 32-bit protected mode, paging off, CS = flat 32-bit code (PVH-like);
    /// 32-bit IDT.
    Protected32,
    /// Long mode set up by the VMM through KVM_SET_SREGS, CPL0, 64-bit IDT.
    Long64,
}

/// What to place into a probe VM before it runs.
pub struct Program {
    pub mode: StartMode,
    pub handler_exit: HandlerExit,
    pub kernel: Asm,
    /// Additional code blocks (user code, landing points).
    pub extra: Vec<Asm>,
    /// MSRs to set before the run (after KVM_SET_CPUID2).
    pub msrs: Vec<(u32, u64)>,
    /// Extra EFER bits for [`StartMode::Long64`] (e.g. SCE).
    pub efer_extra: u64,
    /// Answer the guest's RDMSR of this MSR from the VMM with this value,
    /// through a user-space MSR exit (KVM_CAP_X86_USER_SPACE_MSR plus an
    /// MSR filter that denies the read in KVM).
    pub rdmsr_trap: Option<(u32, u64)>,
    /// 64-bit IDT gates (DPL3 interrupt gates) pointing elsewhere than the
    /// reporting stubs: (vector, handler address).
    pub gate_overrides: Vec<(u8, u64)>,
}

impl Program {
    pub fn new(mode: StartMode, kernel: Asm) -> Self {
        Program {
            mode,
            handler_exit: HandlerExit::Halt,
            kernel,
            extra: Vec::new(),
            msrs: Vec::new(),
            efer_extra: 0,
            rdmsr_trap: None,
            gate_overrides: Vec::new(),
        }
    }
}

/// One probe VM.
pub struct ProbeVm {
    // The VM fd must outlive the vCPU; kept for the stats fd probe too.
    pub vm: VmFd,
    pub vcpu: VcpuFd,
    mem: GuestMemoryMmap,
    rdmsr_trap: Option<(u32, u64)>,
    /// RDMSR exits the VMM answered.
    pub rdmsr_exits: u32,
}

impl ProbeVm {
    /// A VM with RAM at [0, MEM_SIZE) and vCPU 0 with the supported CPUID.
    pub fn new(kit: &Kit) -> Result<Self, VmError> {
        Self::with_extra_ram(kit, None)
    }

    /// As [`ProbeVm::new`], plus a second RAM slot of `size` bytes at
    /// guest-physical `base` (above the report addresses, page-aligned), for
    /// probes that need more than the 64 KiB (the refill probe's working set
    /// and its page tables). The report addresses stay unbacked.
    pub fn with_extra_ram(kit: &Kit, extra: Option<(u64, usize)>) -> Result<Self, VmError> {
        let mut ranges = vec![(GuestAddress(0), MEM_SIZE)];
        if let Some((base, size)) = extra {
            if base < code::report::LIMIT || base % 0x1000 != 0 || size % 0x1000 != 0 {
                return Err(VmError::Memory(format!(
                    "extra probe RAM at {base:#x} (+{size:#x}) must be page-aligned and above the report addresses"
                )));
            }
            ranges.push((GuestAddress(base), size));
        }
        let vm = kit.kvm.create_vm().map_err(VmError::CreateVm)?;
        let mem = GuestMemoryMmap::<()>::from_ranges(&ranges)
            .map_err(|e| VmError::Memory(e.to_string()))?;
        for (slot, &(gpa, size)) in ranges.iter().enumerate() {
            let host = mem
                .get_host_address(gpa)
                .map_err(|e| VmError::Memory(e.to_string()))?;
            let region = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: gpa.0,
                memory_size: size as u64,
                userspace_addr: host as u64,
            };
            // SAFETY: the region is one mapping of `size` bytes owned by
            // `mem`, which lives in the returned struct as long as the VM fd
            // does (the fields drop in declaration order: vm, vcpu, then mem;
            // a VM fd that is closed no longer references the memory).
            unsafe { vm.set_user_memory_region(region) }.map_err(VmError::SetMemory)?;
        }
        let vcpu = vm.create_vcpu(0).map_err(VmError::CreateVcpu)?;
        // Mandatory here: without it the guest's EFER.LME write #GPs.
        vcpu.set_cpuid2(&kit.cpuid).map_err(VmError::SetCpuid)?;
        Ok(ProbeVm {
            vm,
            vcpu,
            mem,
            rdmsr_trap: None,
            rdmsr_exits: 0,
        })
    }

    /// Writes `bytes` to guest memory at `gpa` (any RAM slot).
    pub fn write(&self, gpa: u64, bytes: &[u8]) -> Result<(), VmError> {
        self.mem
            .write_slice(bytes, GuestAddress(gpa))
            .map_err(|e| VmError::WriteMemory(e.to_string()))
    }

    /// Reads guest memory at `gpa` (any RAM slot) into `buf`.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), VmError> {
        self.mem
            .read_slice(buf, GuestAddress(gpa))
            .map_err(|e| VmError::WriteMemory(format!("reading probe memory: {e}")))
    }

    /// Writes the shared tables, the handlers and the program, and sets the
    /// vCPU's registers for its start mode.
    pub fn load(&mut self, p: &Program) -> Result<(), VmError> {
        for (gpa, entry) in code::page_tables() {
            self.write(gpa, &entry.to_le_bytes())?;
        }
        self.write(code::GDT, &code::gdt())?;
        self.write(code::TSS, &code::tss64())?;
        self.write(code::STUBS, code::stubs().bytes())?;
        let (idt, handler) = match p.mode {
            StartMode::Protected32 => (code::idt32(), code::common_handler32()),
            StartMode::Long64 => (code::idt64(), code::common_handler64(p.handler_exit)),
        };
        self.write(code::IDT, &idt)?;
        for &(vector, handler) in &p.gate_overrides {
            let gate = code::gate64(handler);
            self.write(code::IDT + u64::from(vector) * 16, &gate)?;
        }
        self.write(code::COMMON_HANDLER, handler.bytes())?;
        self.write(p.kernel.origin(), p.kernel.bytes())?;
        for a in &p.extra {
            self.write(a.origin(), a.bytes())?;
        }

        let mut sregs = self.vcpu.get_sregs().map_err(|source| VmError::VcpuState {
            what: "KVM_GET_SREGS",
            source,
        })?;
        set_segments(&mut sregs, p.mode);
        sregs.gdt.base = code::GDT;
        sregs.gdt.limit = code::GDT_LIMIT;
        sregs.idt.base = code::IDT;
        match p.mode {
            StartMode::Protected32 => {
                sregs.idt.limit = 256 * 8 - 1;
                // PE | ET: protected mode, paging off, as PVH starts a guest.
                sregs.cr0 = 0x11;
                sregs.cr3 = 0;
                sregs.cr4 = 0;
                sregs.efer = 0;
            }
            StartMode::Long64 => {
                sregs.idt.limit = 256 * 16 - 1;
                // PG | WP | NE | ET | MP | PE.
                sregs.cr0 = 0x8005_0033;
                sregs.cr3 = code::PML4;
                sregs.cr4 = 0x20; // PAE
                sregs.efer = crate::x86::efer::LME | crate::x86::efer::LMA | p.efer_extra;
            }
        }
        self.vcpu
            .set_sregs(&sregs)
            .map_err(|source| VmError::VcpuState {
                what: "KVM_SET_SREGS",
                source,
            })?;
        let regs = kvm_regs {
            rip: p.kernel.origin(),
            rsp: code::KERNEL_STACK_TOP,
            // Bit 1 is reserved-set; IF off so nothing asynchronous arrives.
            rflags: 0x2,
            ..Default::default()
        };
        self.vcpu
            .set_regs(&regs)
            .map_err(|source| VmError::VcpuState {
                what: "KVM_SET_REGS",
                source,
            })?;
        if !p.msrs.is_empty() {
            self.set_msrs(&p.msrs)?;
        }
        if let Some((index, _)) = p.rdmsr_trap {
            self.trap_rdmsr(index)?;
        }
        self.rdmsr_trap = p.rdmsr_trap;
        Ok(())
    }

    /// Makes the guest's RDMSR of `index` exit to the VMM (the same
    /// route the VMM uses for `--cpu-vuln`: [`crate::machine::msr::trap_msr`]).
    fn trap_rdmsr(&self, index: u32) -> Result<(), VmError> {
        crate::machine::msr::trap_msr(&self.vm, index, MsrFilterRangeFlags::READ).map_err(|e| {
            let (what, source) = e.ioctl().unwrap_or((
                "KVM_CAP_X86_USER_SPACE_MSR / KVM_CAP_X86_MSR_FILTER",
                kvm_ioctls::Error::new(libc::ENOTSUP),
            ));
            VmError::VcpuState { what, source }
        })
    }

    /// KVM_SET_MSRS; an MSR the host refuses is an error.
    pub fn set_msrs(&self, msrs: &[(u32, u64)]) -> Result<(), VmError> {
        let entries: Vec<kvm_msr_entry> = msrs
            .iter()
            .map(|&(index, data)| kvm_msr_entry {
                index,
                data,
                ..Default::default()
            })
            .collect();
        let m = Msrs::from_entries(&entries).map_err(|_| VmError::VcpuState {
            what: "building the MSR list",
            source: kvm_ioctls::Error::new(libc::EINVAL),
        })?;
        let n = self
            .vcpu
            .set_msrs(&m)
            .map_err(|source| VmError::VcpuState {
                what: "KVM_SET_MSRS",
                source,
            })?;
        if n != entries.len() {
            let index = msrs.get(n).map(|m| m.0).unwrap_or(0);
            log::debug!("KVM_SET_MSRS stopped at MSR {index:#x}");
            return Err(VmError::VcpuState {
                what: "KVM_SET_MSRS (an MSR was refused)",
                source: kvm_ioctls::Error::new(libc::EINVAL),
            });
        }
        Ok(())
    }

    /// KVM_GET_MSRS of one MSR; `None` if KVM does not know it.
    pub fn get_msr(&self, index: u32) -> Option<u64> {
        crate::machine::msr::get_msr(&self.vcpu, index)
    }

    /// Runs the vCPU until the probe ends, stops, or the watchdog fires.
    pub fn run(&mut self, timeout: Duration) -> Result<Trace, VmError> {
        // The VMM's one kick mechanism: the watchdog thread kicks this
        // thread, whose registered vCPU then leaves KVM_RUN with EINTR.
        let registration = KickRegistration::register(&mut self.vcpu).map_err(VmError::Kick)?;
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        let fired = AtomicBool::new(false);
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let result = std::thread::scope(|s| {
            let fired = &fired;
            s.spawn(move || watchdog(me, timeout, done_rx, fired));
            let r = self.run_loop(fired);
            // Unregister before releasing the watchdog: a late kick then
            // finds no vCPU and does nothing.
            drop(registration);
            // The watchdog may already have exited; a send error is fine.
            let _ = done_tx.send(());
            r
        });
        self.vcpu.set_kvm_immediate_exit(0);
        let (writes, stop) = result?;
        let rip = self.vcpu.get_regs().ok().map(|r| r.rip);
        let cr3 = self.vcpu.get_sregs().ok().map(|s| s.cr3);
        Ok(Trace {
            writes,
            stop,
            rip,
            cr3,
        })
    }

    fn run_loop(&mut self, fired: &AtomicBool) -> Result<(Vec<(u64, u64)>, Stop), VmError> {
        // Bounds so that a guest flooding reports cannot make the probe slow
        // or memory-hungry: probe code does a few dozen writes.
        const MAX_WRITES: usize = 512;
        let mut writes = Vec::new();
        loop {
            let exit = self.vcpu.run();
            let stop = match exit {
                Ok(VcpuExit::MmioWrite(addr, data))
                    if (code::report::BASE..code::report::LIMIT).contains(&addr) =>
                {
                    let mut v = [0u8; 8];
                    let n = data.len().min(8);
                    v[..n].copy_from_slice(&data[..n]);
                    let value = u64::from_le_bytes(v) & code::report::mask(addr);
                    if addr == code::report::END {
                        Some(Stop::End(value as u32))
                    } else if writes.len() >= MAX_WRITES {
                        Some(Stop::Other("report flood".into()))
                    } else {
                        writes.push((addr, value));
                        None
                    }
                }
                Ok(VcpuExit::X86Rdmsr(exit)) => {
                    self.rdmsr_exits += 1;
                    match self.rdmsr_trap {
                        Some((index, value)) if index == exit.index => {
                            *exit.data = value;
                            *exit.error = 0;
                        }
                        // Anything else: the #GP the guest would have got.
                        _ => *exit.error = 1,
                    }
                    None
                }
                Ok(VcpuExit::IoOut(port, _)) => {
                    Some(Stop::Other(format!("port write to {port:#x}")))
                }
                Ok(VcpuExit::IoIn(_, data)) => {
                    data.fill(0xff);
                    None
                }
                Ok(VcpuExit::Hlt) => Some(Stop::Hlt),
                Ok(VcpuExit::Shutdown) => Some(Stop::Shutdown),
                Ok(VcpuExit::InternalError) => {
                    // SAFETY: the exit reason says the `internal` union member is valid.
                    let sub = unsafe { self.vcpu.get_kvm_run().__bindgen_anon_1.internal.suberror };
                    Some(Stop::InternalError(sub))
                }
                Ok(VcpuExit::FailEntry(reason, _)) => Some(Stop::FailEntry(reason)),
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    data.fill(0);
                    Some(Stop::Mmio(addr))
                }
                Ok(VcpuExit::MmioWrite(addr, _)) => Some(Stop::Mmio(addr)),
                Ok(VcpuExit::Intr) => self.interrupted(fired),
                Ok(other) => Some(Stop::Other(format!("{other:?}"))),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.interrupted(fired)
                }
                Err(e) => return Err(VmError::Run(e)),
            };
            if let Some(stop) = stop {
                return Ok((writes, stop));
            }
        }
    }

    /// KVM_RUN returned because of a signal: a timeout if the watchdog fired,
    /// else a stray signal, and the run goes on.
    fn interrupted(&mut self, fired: &AtomicBool) -> Option<Stop> {
        if fired.load(Ordering::SeqCst) {
            Some(Stop::Timeout)
        } else {
            self.vcpu.set_kvm_immediate_exit(0);
            None
        }
    }
}

/// Segment registers for the start mode (the probe GDT's selectors).
fn set_segments(sregs: &mut kvm_sregs, mode: StartMode) {
    let long_mode = mode == StartMode::Long64;
    set_flat(
        sregs,
        FlatSelectors {
            code: if long_mode {
                sel::KERNEL_CS
            } else {
                sel::KERNEL_CS32
            },
            data: sel::KERNEL_DS,
            tss: sel::TSS,
            tss_base: code::TSS,
        },
        long_mode,
    );
}

/// Waits `timeout` for the run to finish; then kicks the vCPU thread every
/// millisecond until the run loop acknowledges by sending on `done`.
fn watchdog(
    target: libc::pthread_t,
    timeout: Duration,
    done: mpsc::Receiver<()>,
    fired: &AtomicBool,
) {
    if done.recv_timeout(timeout) != Err(mpsc::RecvTimeoutError::Timeout) {
        return;
    }
    fired.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let mut warned = false;
    // Keep kicking until acknowledged: a kick that lands while the vCPU
    // thread is between ioctls is not lost (immediate_exit stays set), but
    // re-kicking costs nothing and covers any other race.
    loop {
        // SAFETY: `target` is the thread running ProbeVm::run, alive until
        // the scope joins this thread.
        if let Err(e) = unsafe { kick(target) } {
            log::warn!("kicking the probe vCPU: {e}");
        }
        match done.recv_timeout(Duration::from_millis(1)) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        if !warned && start.elapsed() > Duration::from_secs(1) {
            log::warn!("probe vCPU has not reacted to kicks for 1 s");
            warned = true;
        }
    }
}
