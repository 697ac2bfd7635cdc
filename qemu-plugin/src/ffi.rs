//! QEMU's plugin C API (`include/qemu/qemu-plugin.h`), the part this plugin
//! uses, resolved at install time with `dlsym` from the QEMU executable
//! (which exports it). Nothing is linked, so the crate's unit tests build
//! without QEMU.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};

/// `qemu_plugin_id_t`.
pub type PluginId = u64;

/// `struct qemu_plugin_tb` (opaque).
#[repr(C)]
pub struct Tb {
    _private: [u8; 0],
}

/// `struct qemu_plugin_insn` (opaque).
#[repr(C)]
pub struct Insn {
    _private: [u8; 0],
}

/// `qemu_info_t`, with its union's `system` member (system emulation).
#[repr(C)]
pub struct QemuInfo {
    /// `target_name`.
    pub target_name: *const c_char,
    /// `version.min`: the oldest API version this QEMU accepts.
    pub version_min: c_int,
    /// `version.cur`: the API version this QEMU implements.
    pub version_cur: c_int,
    /// `system_emulation`.
    pub system_emulation: bool,
    /// `system.smp_vcpus`.
    pub smp_vcpus: c_int,
    /// `system.max_vcpus`.
    pub max_vcpus: c_int,
}

/// `QEMU_PLUGIN_CB_NO_REGS`.
pub const CB_NO_REGS: c_int = 0;

/// `qemu_plugin_vcpu_udata_cb_t`.
pub type VcpuUdataCb = extern "C" fn(c_uint, *mut c_void);
/// `qemu_plugin_vcpu_tb_trans_cb_t`.
pub type TbTransCb = extern "C" fn(PluginId, *mut Tb);
/// `qemu_plugin_udata_cb_t`.
pub type UdataCb = extern "C" fn(PluginId, *mut c_void);

type InsnDataOld = unsafe extern "C" fn(*const Insn) -> *const c_void;
type InsnDataNew = unsafe extern "C" fn(*const Insn, *mut c_void, usize) -> usize;

/// The API functions, resolved.
pub struct Api {
    /// `qemu_plugin_tb_n_insns`.
    pub tb_n_insns: unsafe extern "C" fn(*const Tb) -> usize,
    /// `qemu_plugin_tb_get_insn`.
    pub tb_get_insn: unsafe extern "C" fn(*const Tb, usize) -> *mut Insn,
    /// `qemu_plugin_insn_vaddr`.
    pub insn_vaddr: unsafe extern "C" fn(*const Insn) -> u64,
    /// `qemu_plugin_insn_size`.
    pub insn_size: unsafe extern "C" fn(*const Insn) -> usize,
    /// `qemu_plugin_insn_data`, whose signature depends on the API version.
    insn_data: *mut c_void,
    /// API version 3 and later: `qemu_plugin_insn_data` copies into a buffer.
    insn_data_copies: bool,
    /// `qemu_plugin_register_vcpu_tb_exec_cb`.
    pub register_tb_exec: unsafe extern "C" fn(*mut Tb, VcpuUdataCb, c_int, *mut c_void),
    /// `qemu_plugin_register_vcpu_insn_exec_cb`.
    pub register_insn_exec: unsafe extern "C" fn(*mut Insn, VcpuUdataCb, c_int, *mut c_void),
    /// `qemu_plugin_register_vcpu_tb_trans_cb`.
    pub register_tb_trans: unsafe extern "C" fn(PluginId, TbTransCb),
    /// `qemu_plugin_register_atexit_cb`.
    pub register_atexit: unsafe extern "C" fn(PluginId, UdataCb, *mut c_void),
    /// `qemu_plugin_outs`.
    outs: unsafe extern "C" fn(*const c_char),
}

// SAFETY: function pointers into QEMU, callable from any vCPU thread (the
// API is thread-safe for these calls); `insn_data` is one of them.
unsafe impl Send for Api {}
// SAFETY: as above; nothing in `Api` is mutated after install.
unsafe impl Sync for Api {}

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// glibc's `RTLD_DEFAULT`: search the executable and its libraries.
const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();

fn sym(name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| name.to_string())?;
    // SAFETY: a NUL-terminated name; dlsym only reads it.
    let p = unsafe { dlsym(RTLD_DEFAULT, c.as_ptr()) };
    if p.is_null() {
        Err(name.to_string())
    } else {
        Ok(p)
    }
}

macro_rules! resolve {
    ($name:literal, $t:ty) => {{
        let p = sym($name)?;
        // SAFETY: the symbol is QEMU's function of that name, whose C
        // signature `$t` spells out.
        unsafe { std::mem::transmute::<*mut c_void, $t>(p) }
    }};
}

type TbNInsns = unsafe extern "C" fn(*const Tb) -> usize;
type TbGetInsn = unsafe extern "C" fn(*const Tb, usize) -> *mut Insn;
type InsnU64 = unsafe extern "C" fn(*const Insn) -> u64;
type InsnSize = unsafe extern "C" fn(*const Insn) -> usize;
type RegTbExec = unsafe extern "C" fn(*mut Tb, VcpuUdataCb, c_int, *mut c_void);
type RegInsnExec = unsafe extern "C" fn(*mut Insn, VcpuUdataCb, c_int, *mut c_void);
type RegTbTrans = unsafe extern "C" fn(PluginId, TbTransCb);
type RegAtexit = unsafe extern "C" fn(PluginId, UdataCb, *mut c_void);
type Outs = unsafe extern "C" fn(*const c_char);

impl Api {
    /// Looks every function up; `Err` names the first missing one.
    pub fn resolve() -> Result<Api, String> {
        Ok(Api {
            tb_n_insns: resolve!("qemu_plugin_tb_n_insns", TbNInsns),
            tb_get_insn: resolve!("qemu_plugin_tb_get_insn", TbGetInsn),
            insn_vaddr: resolve!("qemu_plugin_insn_vaddr", InsnU64),
            insn_size: resolve!("qemu_plugin_insn_size", InsnSize),
            insn_data: sym("qemu_plugin_insn_data")?,
            insn_data_copies: false,
            register_tb_exec: resolve!("qemu_plugin_register_vcpu_tb_exec_cb", RegTbExec),
            register_insn_exec: resolve!("qemu_plugin_register_vcpu_insn_exec_cb", RegInsnExec),
            register_tb_trans: resolve!("qemu_plugin_register_vcpu_tb_trans_cb", RegTbTrans),
            register_atexit: resolve!("qemu_plugin_register_atexit_cb", RegAtexit),
            outs: resolve!("qemu_plugin_outs", Outs),
        })
    }

    /// QEMU's `info->version.cur`: from 3 on, `qemu_plugin_insn_data`
    /// takes a buffer (`size_t (insn, void *dest, size_t len)`) instead of
    /// returning a pointer.
    pub fn set_qemu_version(&mut self, cur: c_int) {
        self.insn_data_copies = cur >= 3;
    }

    /// The bytes of `insn` (at most `buf.len()`).
    ///
    /// # Safety
    /// `insn` must be an instruction of the block QEMU is translating, in
    /// its translation callback.
    pub unsafe fn insn_bytes<'a>(&self, insn: *mut Insn, buf: &'a mut [u8; 16]) -> &'a [u8] {
        // SAFETY: `insn` is an instruction of the block being translated.
        let size = unsafe { (self.insn_size)(insn) }.min(buf.len());
        if self.insn_data_copies {
            // SAFETY: the v3+ signature, with a buffer of `size` bytes.
            let f: InsnDataNew = unsafe { std::mem::transmute(self.insn_data) };
            let n = unsafe { f(insn, buf.as_mut_ptr() as *mut c_void, size) }.min(size);
            &buf[..n]
        } else {
            // SAFETY: the v1/v2 signature: a pointer to `size` bytes.
            let f: InsnDataOld = unsafe { std::mem::transmute(self.insn_data) };
            let p = unsafe { f(insn) } as *const u8;
            if p.is_null() {
                return &buf[..0];
            }
            // SAFETY: QEMU's buffer holds the instruction's `size` bytes.
            let src = unsafe { std::slice::from_raw_parts(p, size) };
            buf[..size].copy_from_slice(src);
            &buf[..size]
        }
    }

    /// Prints through QEMU (`qemu_plugin_outs`: QEMU's log, stderr by default).
    pub fn say(&self, text: &str) {
        if let Ok(c) = CString::new(text.replace('\0', " ")) {
            // SAFETY: a NUL-terminated string QEMU only reads.
            unsafe { (self.outs)(c.as_ptr()) }
        }
    }
}
