//! The initramfs of a Linux run: a newc cpio archive (the format the kernel
//! unpacks, `Documentation/driver-api/early-userspace/buffer-format.rst`)
//! built in memory around ptiscope's static init. It is handed to QEMU in a
//! memfd like the kernel image, so nothing is written to the file system.

use crate::spec::linux::LinuxArch;

/// The static init for x86_64 kernels (`linux-init`, x86_64-unknown-linux-musl).
pub static INIT_X86_64: &[u8] = include_bytes!(env!("PTISCOPE_LINUX_INIT_X86_64"));
/// The static init for i386 kernels (`linux-init`, i686-unknown-linux-musl).
pub static INIT_I386: &[u8] = include_bytes!(env!("PTISCOPE_LINUX_INIT_I386"));

/// The init binary for a kernel of `arch`.
pub fn init_for(arch: LinuxArch) -> &'static [u8] {
    match arch {
        LinuxArch::X86_64 => INIT_X86_64,
        LinuxArch::I386 => INIT_I386,
    }
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

/// One newc entry: header, NUL-terminated name and data, each padded to 4 bytes.
fn entry(out: &mut Vec<u8>, ino: u32, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
    let namesize = name.len() + 1;
    let fields: [u32; 13] = [
        ino,
        mode,
        0, // uid
        0, // gid
        if mode & S_IFDIR != 0 { 2 } else { 1 },
        0, // mtime
        data.len() as u32,
        0, // devmajor
        0, // devminor
        rdev.0,
        rdev.1,
        namesize as u32,
        0, // check
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08X}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// The archive: `/dev/console` (the kernel opens it for init's stdin,
/// stdout and stderr), `/proc` (the init mounts procfs there) and `/init`.
pub fn build(init: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(init.len() + 1024);
    entry(&mut out, 1, "dev", S_IFDIR | 0o755, (0, 0), &[]);
    entry(&mut out, 2, "dev/console", S_IFCHR | 0o600, (5, 1), &[]);
    entry(&mut out, 3, "proc", S_IFDIR | 0o755, (0, 0), &[]);
    entry(&mut out, 4, "init", S_IFREG | 0o755, (0, 0), init);
    entry(&mut out, 5, "TRAILER!!!", 0, (0, 0), &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the archive back: (name, mode, data) of every entry.
    fn parse(mut b: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut v = Vec::new();
        let mut off = 0usize;
        loop {
            assert_eq!(&b[..6], b"070701", "at {off}");
            let field = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&b[6 + i * 8..14 + i * 8]).unwrap(), 16)
                    .unwrap()
            };
            let (mode, size, namesize) = (field(1), field(6) as usize, field(11) as usize);
            let name = std::str::from_utf8(&b[110..110 + namesize - 1])
                .unwrap()
                .to_string();
            let data_start = (110 + namesize).next_multiple_of(4);
            let data = b[data_start..data_start + size].to_vec();
            let next = (data_start + size).next_multiple_of(4);
            off += next;
            b = &b[next..];
            if name == "TRAILER!!!" {
                assert!(b.is_empty());
                return v;
            }
            v.push((name, mode, data));
        }
    }

    #[test]
    fn the_archive_holds_the_init_and_its_console() {
        let a = build(b"\x7fELF-ish init of odd length");
        assert_eq!(a.len() % 4, 0);
        let e = parse(&a);
        let names: Vec<&str> = e.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(names, ["dev", "dev/console", "proc", "init"]);
        assert_eq!(e[3].2, b"\x7fELF-ish init of odd length");
        assert_eq!(e[3].1, S_IFREG | 0o755);
        assert_eq!(e[1].1 & S_IFCHR, S_IFCHR);
    }

    #[test]
    fn the_embedded_inits_are_static_elf_executables() {
        assert_eq!(&INIT_X86_64[..5], b"\x7fELF\x02", "ELF64");
        assert_eq!(&INIT_I386[..5], b"\x7fELF\x01", "ELF32");
    }
}
