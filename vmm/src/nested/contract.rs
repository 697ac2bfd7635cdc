//! What the outer ptiscope (`boot`, `session`, `payload`) and the init
//! inside (`init`, `serve`) agree on: where the initramfs puts the request
//! and the modules, the sizes of the two ivshmem windows, the trace
//! switch. A leaf both halves read, so that neither imports the other.

/// Where the request lies in the initramfs.
pub const REQUEST_PATH: &str = "/nested/request.json";
/// Where the modules lie, loaded in [`MODULES`]' order.
pub const MODULE_DIR: &str = "/nested/modules";
/// The modules, in load order (kvm-amd's `npt=` comes from the request's
/// `KvmPaging`).
pub const MODULES: [&str; 3] = ["irqbypass.ko", "kvm.ko", "kvm-amd.ko"];

/// The size of the outer plugin's live file (and of the ivshmem device's
/// memory that shows it to the inner Linux): a power of two, as a PCI
/// BAR's, room for thousands of phase markers.
pub const LIVE_BYTES: u64 = 4 << 20;

/// The blob window's size (a power of two, as a PCI BAR's): room for the
/// kernels and initrds of a session's runs (a Debian kernel is ~8 MB).
pub const BLOB_WINDOW_BYTES: u64 = 64 << 20;

/// Set on the inner kernel's command line (so in the init's environment)
/// when the outer ptiscope logs at debug level (`RUST_LOG=debug`): the
/// init then prints when each set-up step ended on the console, which the
/// outer logs (`init::trace`).
pub const TRACE_ENV: &str = "PTISCOPE_NESTED_TRACE";
/// What the init's trace lines start with on the console.
pub const TRACE_PREFIX: &str = "ptiscope nested init: ";
