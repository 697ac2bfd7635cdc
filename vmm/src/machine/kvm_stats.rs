//! Reader for KVM's binary statistics file descriptors (crate::machine::kvm::request::KVM_GET_STATS_FD()).
//!
//! KVM exposes per-VM and per-vCPU counters through a read-only file whose
//! layout it describes itself (Linux `Documentation/virt/kvm/api.rst`,
//! "KVM_GET_STATS_FD"):
//!
//! ```text
//! +-------------+  offset 0
//! | header      |  flags, name_size, num_desc, id_offset, desc_offset, data_offset
//! +-------------+  id_offset
//! | id string   |  e.g. "kvm-1234/vcpu-0", name_size bytes
//! +-------------+  desc_offset
//! | descriptors |  num_desc x (16 bytes + name_size bytes of NUL-padded name)
//! +-------------+  data_offset
//! | data        |  u64 values; descriptor `offset` is relative to data_offset
//! +-------------+
//! ```
//!
//! The header and descriptors never change for the lifetime of the fd, so we
//! read them once in [`KvmStats::from_vm`] / [`KvmStats::from_vcpu`] and then
//! only re-read the data block in [`KvmStats::read`]. Nothing here is specific
//! to one KVM flavour: every descriptor the host offers is kept, by name, so the
//! reports work on hardware VMX/SVM hosts as well as on kvm_pvm, a
//! software virtualizer (which has e.g. `insn_emulation` and a meaningful
//! `tlb_flush`).
//!
//! Everything the kernel hands back is validated before use (sizes, offsets,
//! name termination); a malformed layout is an error, never a panic.
//!
//! Size: the binary stats-fd format (header, descriptors, data) read
//! defensively; about 330 lines are tests, including malformed descriptors.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use kvm_bindings::{
    KVM_CAP_BINARY_STATS_FD, KVM_STATS_BASE_MASK, KVM_STATS_BASE_POW10, KVM_STATS_BASE_POW2,
    KVM_STATS_TYPE_CUMULATIVE, KVM_STATS_TYPE_INSTANT, KVM_STATS_TYPE_LINEAR_HIST,
    KVM_STATS_TYPE_LOG_HIST, KVM_STATS_TYPE_MASK, KVM_STATS_TYPE_PEAK, KVM_STATS_UNIT_BOOLEAN,
    KVM_STATS_UNIT_BYTES, KVM_STATS_UNIT_CYCLES, KVM_STATS_UNIT_MASK, KVM_STATS_UNIT_NONE,
    KVM_STATS_UNIT_SECONDS,
};
use kvm_ioctls::{VcpuFd, VmFd};

/// Size of `struct kvm_stats_header` (six u32).
const HEADER_SIZE: usize = 24;
/// Size of the fixed part of `struct kvm_stats_desc` before the name.
const DESC_FIXED_SIZE: usize = 16;
/// Upper bounds that no real kernel comes near (Linux 6.x has ~50 vCPU stats
/// with 48-byte names); they keep a corrupt header from making us allocate
/// gigabytes.
const MAX_NAME_SIZE: u32 = 4096;
const MAX_DESCRIPTORS: u32 = 16 * 1024;
const MAX_DATA_BYTES: u64 = 16 * 1024 * 1024;

/// Errors of opening a stats fd and reading its layout or data.
#[derive(Debug, thiserror::Error)]
pub enum KvmStatsError {
    /// The host KVM has no `KVM_CAP_BINARY_STATS_FD` (Linux < 5.14 or a KVM
    /// flavour without it). Reports say "KVM stats fd not available".
    #[error("KVM stats fd not available on this host (no KVM_CAP_BINARY_STATS_FD)")]
    Unsupported,
    /// The `KVM_GET_STATS_FD` ioctl failed for another reason.
    #[error("KVM_GET_STATS_FD failed: {0}")]
    Ioctl(#[source] std::io::Error),
    /// Reading the stats file failed (including short reads).
    #[error("reading the KVM stats fd at offset {offset} ({len} bytes): {source}")]
    Read {
        /// Offset read at, bytes from the start of the file.
        offset: u64,
        /// Bytes asked for.
        len: usize,
        /// The read error (`UnexpectedEof` for a short read).
        #[source]
        source: std::io::Error,
    },
    /// The header or a descriptor describes something impossible.
    #[error("malformed KVM stats layout: {0}")]
    BadLayout(String),
}

/// Errors of computing the difference of two snapshots.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatsDeltaError {
    /// The two snapshots come from different stats fds (different descriptor sets).
    #[error("snapshots come from different KVM stats fds")]
    Mismatch,
    /// A cumulative counter is smaller in the later snapshot: the snapshots
    /// were passed in the wrong order, or the kernel reset the counter.
    #[error("cumulative KVM stat {name} went backwards: {before} -> {after}")]
    WentBackwards {
        /// The statistic's name.
        name: String,
        /// Its value in the earlier snapshot.
        before: u64,
        /// Its value in the later snapshot.
        after: u64,
    },
}

/// How a statistic behaves over time (`KVM_STATS_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatType {
    /// Only ever grows; deltas are meaningful.
    Cumulative,
    /// A current value (e.g. pages in use); deltas are not.
    Instant,
    /// A high-water mark.
    Peak,
    /// Histogram with `size` buckets of `bucket_size` each.
    LinearHist,
    /// Histogram with power-of-two buckets.
    LogHist,
    /// A type this code does not know (newer kernel); values are kept raw.
    Unknown(u32),
}

/// Unit of a statistic's values (`KVM_STATS_UNIT_*`), scaled by `base^exponent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatUnit {
    /// A plain count.
    None,
    /// Bytes.
    Bytes,
    /// Seconds.
    Seconds,
    /// CPU cycles.
    Cycles,
    /// 0 or 1.
    Boolean,
    /// A unit this code does not know (newer kernel): the raw value.
    Unknown(u32),
}

/// Base of the unit's exponent (`KVM_STATS_BASE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatBase {
    /// Powers of ten (the exponent scales by 10).
    Pow10,
    /// Powers of two (the exponent scales by 2).
    Pow2,
    /// A base this code does not know (newer kernel): the raw value.
    Unknown(u32),
}

/// One statistic the host offers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StatDesc {
    /// Name as KVM reports it (e.g. `exits`, `tlb_flush`).
    pub name: String,
    /// How the value behaves over time.
    pub stat_type: StatType,
    /// Unit of the values.
    pub unit: StatUnit,
    /// Base of `exponent`.
    pub base: StatBase,
    /// Value = raw * base^exponent in `unit` (e.g. -9 with Pow10 = nanoseconds).
    pub exponent: i16,
    /// Number of u64 items (1 for scalars, buckets for histograms).
    pub size: u16,
    /// Byte offset of the first item from the start of the data block.
    pub offset: u32,
    /// Bucket width of a linear histogram (0 otherwise).
    pub bucket_size: u32,
}

impl StatDesc {
    /// True for the two histogram types.
    pub fn is_histogram(&self) -> bool {
        matches!(self.stat_type, StatType::LinearHist | StatType::LogHist)
    }
}

/// Which object a stats fd belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatsScope {
    /// The VM's stats fd (`KVM_GET_STATS_FD` on the VM).
    Vm,
    /// A vCPU's stats fd.
    Vcpu,
}

/// An open KVM stats fd with its (immutable) layout.
#[derive(Debug)]
pub struct KvmStats {
    file: File,
    scope: StatsScope,
    id: String,
    data_offset: u64,
    data_len: usize,
    descs: Arc<[StatDesc]>,
}

/// Values of every statistic at one moment, in descriptor order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSnapshot {
    descs: Arc<[StatDesc]>,
    values: Vec<Vec<u64>>,
}

impl KvmStats {
    /// Opens the per-VM stats fd.
    pub fn from_vm(vm: &VmFd) -> Result<Self, KvmStatsError> {
        // Asking first gives a clean "unsupported" on old hosts instead of
        // depending on which errno an unknown ioctl produces.
        if vm.check_extension_raw(libc::c_ulong::from(KVM_CAP_BINARY_STATS_FD)) <= 0 {
            return Err(KvmStatsError::Unsupported);
        }
        Self::open(vm.as_raw_fd(), StatsScope::Vm)
    }

    /// Opens the stats fd of one vCPU.
    pub fn from_vcpu(vcpu: &VcpuFd) -> Result<Self, KvmStatsError> {
        Self::open(vcpu.as_raw_fd(), StatsScope::Vcpu)
    }

    fn open(fd: RawFd, scope: StatsScope) -> Result<Self, KvmStatsError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and only returns a new
        // file descriptor (or -1); `fd` is a valid VM or vCPU fd borrowed from
        // kvm-ioctls for the duration of the call.
        let ret = unsafe { libc::ioctl(fd, crate::machine::kvm::request::KVM_GET_STATS_FD() as _) };
        if ret < 0 {
            let err = std::io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::ENOTTY) | Some(libc::EINVAL) => KvmStatsError::Unsupported,
                _ => KvmStatsError::Ioctl(err),
            });
        }
        // SAFETY: the ioctl succeeded, so `ret` is a fresh fd that nobody else
        // owns; the File takes ownership and closes it on drop.
        let file = unsafe { File::from_raw_fd(ret) };
        Self::from_file(file, scope)
    }

    /// Parses the layout of an already open stats file (also used by tests
    /// with synthetic files).
    pub fn from_file(file: File, scope: StatsScope) -> Result<Self, KvmStatsError> {
        let mut hdr = [0u8; HEADER_SIZE];
        read_at(&file, &mut hdr, 0)?;
        let field = |i: usize| u32::from_le_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
        let (name_size, num_desc) = (field(4), field(8));
        let (id_offset, desc_offset, data_offset) = (field(12), field(16), field(20));

        if name_size == 0 || name_size > MAX_NAME_SIZE {
            return Err(bad(format!("name_size {name_size}")));
        }
        if num_desc > MAX_DESCRIPTORS {
            return Err(bad(format!("num_desc {num_desc}")));
        }
        let name_size = name_size as usize;

        let mut id_buf = vec![0u8; name_size];
        read_at(&file, &mut id_buf, u64::from(id_offset))?;
        let id = c_string(&id_buf).unwrap_or_default();

        let desc_len = DESC_FIXED_SIZE + name_size;
        let mut desc_buf = vec![0u8; desc_len * num_desc as usize];
        read_at(&file, &mut desc_buf, u64::from(desc_offset))?;

        let mut descs = Vec::with_capacity(num_desc as usize);
        let mut data_len: u64 = 0;
        for (i, raw) in desc_buf.chunks_exact(desc_len).enumerate() {
            let desc = parse_desc(raw).map_err(|what| bad(format!("descriptor {i}: {what}")))?;
            // Each item is a u64; the data block must hold all of them.
            let end = u64::from(desc.offset) + u64::from(desc.size) * 8;
            if desc.offset % 8 != 0 {
                return Err(bad(format!(
                    "{}: unaligned offset {}",
                    desc.name, desc.offset
                )));
            }
            if desc.size == 0 {
                return Err(bad(format!("{}: size 0", desc.name)));
            }
            data_len = data_len.max(end);
            descs.push(desc);
        }
        if data_len > MAX_DATA_BYTES {
            return Err(bad(format!("data block of {data_len} bytes")));
        }
        Ok(KvmStats {
            file,
            scope,
            id,
            data_offset: u64::from(data_offset),
            // Bounded by MAX_DATA_BYTES just above.
            data_len: data_len as usize,
            descs: descs.into(),
        })
    }

    /// VM or vCPU.
    pub fn scope(&self) -> StatsScope {
        self.scope
    }

    /// The id string KVM gives the fd (e.g. `kvm-1234/vcpu-0`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// All statistics the host offers, in file order.
    pub fn descriptors(&self) -> &[StatDesc] {
        &self.descs
    }

    /// The descriptor called `name`, if the host has it.
    pub fn descriptor(&self, name: &str) -> Option<&StatDesc> {
        self.descs.iter().find(|d| d.name == name)
    }

    /// Reads the current value of every statistic (one pread of the data block).
    pub fn read(&self) -> Result<StatsSnapshot, KvmStatsError> {
        let mut data = vec![0u8; self.data_len];
        read_at(&self.file, &mut data, self.data_offset)?;
        let values = self
            .descs
            .iter()
            .map(|d| {
                let start = d.offset as usize;
                // In bounds: data_len is the maximum end over all descriptors.
                data[start..start + usize::from(d.size) * 8]
                    .chunks_exact(8)
                    .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                    .collect()
            })
            .collect();
        Ok(StatsSnapshot {
            descs: Arc::clone(&self.descs),
            values,
        })
    }
}

impl StatsSnapshot {
    /// Descriptors, in the same order as the values.
    pub fn descriptors(&self) -> &[StatDesc] {
        &self.descs
    }

    /// The scalar value of `name` (the first item for a histogram).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values_of(name).and_then(|v| v.first().copied())
    }

    /// All items of `name` (buckets of a histogram; one item for a scalar).
    pub fn values_of(&self, name: &str) -> Option<&[u64]> {
        let i = self.descs.iter().position(|d| d.name == name)?;
        self.values.get(i).map(Vec::as_slice)
    }

    /// `(descriptor, values)` for every statistic.
    pub fn iter(&self) -> impl Iterator<Item = (&StatDesc, &[u64])> {
        self.descs.iter().zip(self.values.iter().map(Vec::as_slice))
    }

    /// Scalars only, as `(name, value)`: what reports usually want.
    pub fn scalars(&self) -> impl Iterator<Item = (&str, u64)> {
        self.iter()
            .filter(|(d, v)| !d.is_histogram() && v.len() == 1)
            .map(|(d, v)| (d.name.as_str(), v[0]))
    }
}

/// What happened between two snapshots of the same fd: cumulative counters
/// and histogram buckets as differences, instant and peak values as they were
/// in `after` (a difference of a level or a high-water mark means nothing).
pub fn delta(
    before: &StatsSnapshot,
    after: &StatsSnapshot,
) -> Result<StatsSnapshot, StatsDeltaError> {
    if !Arc::ptr_eq(&before.descs, &after.descs) && before.descs != after.descs {
        return Err(StatsDeltaError::Mismatch);
    }
    let mut values = Vec::with_capacity(after.values.len());
    for ((desc, b), a) in before.descs.iter().zip(&before.values).zip(&after.values) {
        let v = match desc.stat_type {
            StatType::Cumulative | StatType::LinearHist | StatType::LogHist => b
                .iter()
                .zip(a)
                .map(|(&b, &a)| {
                    a.checked_sub(b)
                        .ok_or_else(|| StatsDeltaError::WentBackwards {
                            name: desc.name.clone(),
                            before: b,
                            after: a,
                        })
                })
                .collect::<Result<Vec<u64>, _>>()?,
            StatType::Instant | StatType::Peak | StatType::Unknown(_) => a.clone(),
        };
        values.push(v);
    }
    Ok(StatsSnapshot {
        descs: Arc::clone(&after.descs),
        values,
    })
}

fn bad(what: String) -> KvmStatsError {
    KvmStatsError::BadLayout(what)
}

fn read_at(file: &File, buf: &mut [u8], offset: u64) -> Result<(), KvmStatsError> {
    file.read_exact_at(buf, offset)
        .map_err(|source| KvmStatsError::Read {
            offset,
            len: buf.len(),
            source,
        })
}

/// The NUL-terminated string at the start of `buf`; `None` if there is no NUL
/// or it is not UTF-8.
fn c_string(buf: &[u8]) -> Option<String> {
    let end = buf.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&buf[..end]).ok().map(str::to_owned)
}

fn parse_desc(raw: &[u8]) -> Result<StatDesc, String> {
    let flags = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
    let exponent = i16::from_le_bytes([raw[4], raw[5]]);
    let size = u16::from_le_bytes([raw[6], raw[7]]);
    let offset = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
    let bucket_size = u32::from_le_bytes([raw[12], raw[13], raw[14], raw[15]]);
    let name = c_string(&raw[DESC_FIXED_SIZE..]).ok_or("name not NUL-terminated UTF-8")?;
    if name.is_empty() {
        return Err("empty name".into());
    }
    let stat_type = match flags & KVM_STATS_TYPE_MASK {
        KVM_STATS_TYPE_CUMULATIVE => StatType::Cumulative,
        KVM_STATS_TYPE_INSTANT => StatType::Instant,
        KVM_STATS_TYPE_PEAK => StatType::Peak,
        KVM_STATS_TYPE_LINEAR_HIST => StatType::LinearHist,
        KVM_STATS_TYPE_LOG_HIST => StatType::LogHist,
        other => StatType::Unknown(other),
    };
    let unit = match flags & KVM_STATS_UNIT_MASK {
        KVM_STATS_UNIT_NONE => StatUnit::None,
        KVM_STATS_UNIT_BYTES => StatUnit::Bytes,
        KVM_STATS_UNIT_SECONDS => StatUnit::Seconds,
        KVM_STATS_UNIT_CYCLES => StatUnit::Cycles,
        KVM_STATS_UNIT_BOOLEAN => StatUnit::Boolean,
        other => StatUnit::Unknown(other),
    };
    let base = match flags & KVM_STATS_BASE_MASK {
        KVM_STATS_BASE_POW10 => StatBase::Pow10,
        KVM_STATS_BASE_POW2 => StatBase::Pow2,
        other => StatBase::Unknown(other),
    };
    Ok(StatDesc {
        name,
        stat_type,
        unit,
        base,
        exponent,
        size,
        offset,
        bucket_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Builds a stats file image the way the kernel lays it out.
    fn image(name_size: u32, descs: &[(&str, u32, u16, u32)], data: &[u64]) -> Vec<u8> {
        let desc_len = DESC_FIXED_SIZE + name_size as usize;
        let id_offset = HEADER_SIZE as u32;
        let desc_offset = id_offset + name_size;
        let data_offset = desc_offset + (desc_len * descs.len()) as u32;
        let mut out = Vec::new();
        for v in [
            0,
            name_size,
            descs.len() as u32,
            id_offset,
            desc_offset,
            data_offset,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let mut id = b"kvm-1/vcpu-0".to_vec();
        id.resize(name_size as usize, 0);
        out.extend_from_slice(&id);
        for (name, flags, size, offset) in descs {
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&0i16.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            let mut n = name.as_bytes().to_vec();
            n.resize(name_size as usize, 0);
            out.extend_from_slice(&n);
        }
        for v in data {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    fn file_with(bytes: &[u8]) -> File {
        let mut f = tempfile();
        f.write_all(bytes).unwrap();
        f
    }

    fn tempfile() -> File {
        // An unlinked file in /tmp: no extra dev-dependency needed.
        let path = std::env::temp_dir().join(format!(
            "ptiscope-kvmstats-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    const HIST: u32 = KVM_STATS_TYPE_LOG_HIST;
    const PEAK: u32 = KVM_STATS_TYPE_PEAK;
    const SECS_NS: u32 = KVM_STATS_UNIT_SECONDS;

    #[test]
    fn synthetic_layout_parses_and_reads() {
        let img = image(
            32,
            &[
                ("exits", 0, 1, 0),
                ("halt_hist", HIST | SECS_NS, 3, 8),
                ("peak", PEAK, 1, 32),
            ],
            &[10, 1, 2, 3, 7],
        );
        let stats = KvmStats::from_file(file_with(&img), StatsScope::Vcpu).unwrap();
        assert_eq!(stats.id(), "kvm-1/vcpu-0");
        assert_eq!(stats.descriptors().len(), 3);
        let h = stats.descriptor("halt_hist").unwrap();
        assert_eq!(
            (h.stat_type, h.unit, h.size),
            (StatType::LogHist, StatUnit::Seconds, 3)
        );
        let snap = stats.read().unwrap();
        assert_eq!(snap.get("exits"), Some(10));
        assert_eq!(snap.values_of("halt_hist"), Some(&[1, 2, 3][..]));
        assert_eq!(snap.get("peak"), Some(7));
        assert_eq!(snap.scalars().count(), 2, "histograms are not scalars");
    }

    #[test]
    fn malformed_layouts_are_errors_not_panics() {
        // Descriptor pointing past the data the file holds: short read.
        let img = image(16, &[("exits", 0, 1, 800)], &[1]);
        let stats = KvmStats::from_file(file_with(&img), StatsScope::Vcpu).unwrap();
        assert!(matches!(stats.read(), Err(KvmStatsError::Read { .. })));
        // Unaligned offset.
        let img = image(16, &[("exits", 0, 1, 3)], &[1, 2]);
        assert!(matches!(
            KvmStats::from_file(file_with(&img), StatsScope::Vcpu),
            Err(KvmStatsError::BadLayout(_))
        ));
        // Zero name size, and a name without its NUL.
        let mut img = image(16, &[("exits", 0, 1, 0)], &[1]);
        img[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            KvmStats::from_file(file_with(&img), StatsScope::Vcpu),
            Err(KvmStatsError::BadLayout(_))
        ));
        let img = image(5, &[("exits", 0, 1, 0)], &[1]);
        assert!(matches!(
            KvmStats::from_file(file_with(&img), StatsScope::Vcpu),
            Err(KvmStatsError::BadLayout(_))
        ));
        // Huge descriptor count.
        let mut img = image(16, &[("exits", 0, 1, 0)], &[1]);
        img[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            KvmStats::from_file(file_with(&img), StatsScope::Vcpu),
            Err(KvmStatsError::BadLayout(_))
        ));
        // Truncated file.
        assert!(matches!(
            KvmStats::from_file(file_with(&img[..10]), StatsScope::Vcpu),
            Err(KvmStatsError::Read { .. })
        ));
    }

    #[test]
    fn delta_semantics() {
        let descs: Arc<[StatDesc]> = vec![
            parse_desc(&raw_desc("exits", 0, 1)).unwrap(),
            parse_desc(&raw_desc("level", KVM_STATS_TYPE_INSTANT, 1)).unwrap(),
            parse_desc(&raw_desc("hist", HIST, 2)).unwrap(),
        ]
        .into();
        let snap = |v: Vec<Vec<u64>>| StatsSnapshot {
            descs: Arc::clone(&descs),
            values: v,
        };
        let before = snap(vec![vec![5], vec![100], vec![1, 1]]);
        let after = snap(vec![vec![12], vec![40], vec![4, 1]]);
        let d = delta(&before, &after).unwrap();
        assert_eq!(d.get("exits"), Some(7));
        assert_eq!(d.get("level"), Some(40), "instant values are taken as-is");
        assert_eq!(d.values_of("hist"), Some(&[3, 0][..]));
        assert_eq!(
            delta(&after, &before),
            Err(StatsDeltaError::WentBackwards {
                name: "exits".into(),
                before: 12,
                after: 5
            })
        );
        let other = StatsSnapshot {
            descs: vec![parse_desc(&raw_desc("x", 0, 1)).unwrap()].into(),
            values: vec![vec![1]],
        };
        assert_eq!(delta(&before, &other), Err(StatsDeltaError::Mismatch));
    }

    fn raw_desc(name: &str, flags: u32, size: u16) -> Vec<u8> {
        let mut v = flags.to_le_bytes().to_vec();
        v.extend_from_slice(&0i16.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&[0; 8]);
        v.extend_from_slice(name.as_bytes());
        v.push(0);
        v
    }

    mod live {
        use super::super::*;
        use kvm_bindings::{kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
        use kvm_ioctls::{Kvm, VcpuExit};
        use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

        fn kvm() -> Option<Kvm> {
            if !std::path::Path::new("/dev/kvm").exists() {
                crate::test_support::skip("kvm_stats", "/dev/kvm is absent on this host");
                return None;
            }
            match Kvm::new() {
                Ok(k) => Some(k),
                Err(e) => {
                    crate::test_support::skip("kvm_stats", &format!("cannot open /dev/kvm: {e}"));
                    None
                }
            }
        }

        /// Opens stats or skips (returns None) on a host without the cap.
        fn open<T>(r: Result<T, KvmStatsError>) -> Option<T> {
            match r {
                Ok(s) => Some(s),
                Err(KvmStatsError::Unsupported) => {
                    crate::test_support::skip(
                        "kvm_stats",
                        "KVM stats fd not available on this host",
                    );
                    None
                }
                Err(e) => panic!("opening stats fd: {e}"),
            }
        }

        const OUTS: usize = 4;

        /// Real-mode code at 0x1000: `mov dx, 0x3f8; mov al, 'A'`, OUTS x
        /// `out dx, al`, `hlt`.
        fn code() -> Vec<u8> {
            let mut c = vec![0xba, 0xf8, 0x03, 0xb0, b'A'];
            c.extend(std::iter::repeat_n(0xee, OUTS));
            c.push(0xf4);
            c
        }

        #[test]
        fn live_vm_and_vcpu_stats() {
            let Some(kvm) = kvm() else { return };
            let vm = kvm.create_vm().unwrap();
            let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
            mem.write_slice(&code(), GuestAddress(0x1000)).unwrap();
            let host = mem.get_host_address(GuestAddress(0)).unwrap();
            let region = kvm_userspace_memory_region {
                slot: 0,
                guest_phys_addr: 0,
                memory_size: 0x10000,
                userspace_addr: host as u64,
                flags: 0,
            };
            // SAFETY: the region is backed by `mem`, which outlives `vm`
            // (dropped after it at the end of this function).
            unsafe { vm.set_user_memory_region(region).unwrap() };
            let mut vcpu = vm.create_vcpu(0).unwrap();
            let cpuid = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap();
            vcpu.set_cpuid2(&cpuid).unwrap();
            let mut sregs = vcpu.get_sregs().unwrap();
            sregs.cs.base = 0;
            sregs.cs.selector = 0;
            vcpu.set_sregs(&sregs).unwrap();
            let mut regs = vcpu.get_regs().unwrap();
            regs.rip = 0x1000;
            regs.rflags = 2;
            vcpu.set_regs(&regs).unwrap();

            let Some(vm_stats) = open(KvmStats::from_vm(&vm)) else {
                return;
            };
            let Some(stats) = open(KvmStats::from_vcpu(&vcpu)) else {
                return;
            };
            assert_eq!(stats.scope(), StatsScope::Vcpu);
            let names: Vec<&str> = stats
                .descriptors()
                .iter()
                .map(|d| d.name.as_str())
                .collect();
            eprintln!("vcpu stats ({}): {names:?}", stats.id());
            eprintln!(
                "vm stats ({}): {:?}",
                vm_stats.id(),
                vm_stats
                    .descriptors()
                    .iter()
                    .map(|d| &d.name)
                    .collect::<Vec<_>>()
            );
            assert!(
                names.contains(&"exits"),
                "every KVM has a vcpu `exits` stat"
            );
            assert!(!vm_stats.descriptors().is_empty());
            // The software virtualizer kvm_pvm also offers
            // these; on hardware VMX/SVM hosts most do too, but not all.
            let pvm = std::fs::read_to_string("/proc/modules")
                .map(|m| m.lines().any(|l| l.starts_with("kvm_pvm ")))
                .unwrap_or(false);
            if pvm {
                for n in ["insn_emulation", "tlb_flush", "invlpg", "halt_exits"] {
                    assert!(names.contains(&n), "{n} missing on kvm_pvm");
                }
            }

            let s0 = stats.read().unwrap();
            let v0 = vm_stats.read().unwrap();
            let mut outs = 0;
            let mut halted = false;
            for _ in 0..100 {
                match vcpu.run().unwrap() {
                    VcpuExit::IoOut(0x3f8, data) => {
                        assert_eq!(data, b"A");
                        outs += 1;
                    }
                    VcpuExit::Hlt => {
                        halted = true;
                        break;
                    }
                    other => panic!("unexpected exit {other:?}"),
                }
            }
            assert!(halted, "guest did not reach HLT");
            assert_eq!(outs, OUTS);
            let s1 = stats.read().unwrap();
            let v1 = vm_stats.read().unwrap();

            // Monotonic: every cumulative counter is >= its earlier value
            // (delta() fails otherwise), on both fds.
            let d = delta(&s0, &s1).expect("cumulative vcpu stats monotonic");
            delta(&v0, &v1).expect("cumulative vm stats monotonic");
            let exits = d.get("exits").unwrap();
            eprintln!("exits delta {exits} for {OUTS} port writes and a HLT");
            assert!(
                exits > OUTS as u64,
                "each port write and the HLT is an exit to user space (> OUTS)"
            );
            drop(vcpu);
            drop(vm);
            drop(mem);
        }
    }
}
