//! The initramfs of a Linux run: a newc cpio archive (the format the kernel
//! unpacks, `Documentation/driver-api/early-userspace/buffer-format.rst`)
//! built in memory around ptiscope's static init by the `cpio` crate. QEMU
//! gets it in a memfd like the kernel image and the VMM copies it into guest
//! memory, so nothing is written to the file system.

use std::collections::BTreeSet;
use std::io::{self, Write};

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

/// A newc archive built in memory through the `cpio` crate: entries
/// numbered from inode 1 in the order they are added, owned by root with
/// mtime 0 (the same bytes on every run), and a file's parent directories
/// added once, before it. Also the outer initramfs of `--backend nested`.
#[derive(Default)]
pub struct Archive {
    out: Vec<u8>,
    ino: u32,
    dirs: BTreeSet<String>,
    /// The first entry that could not be written; `finish` returns it.
    error: Option<io::Error>,
}

impl Archive {
    /// A directory (mode 0755) and its parents, each once.
    pub fn dir(&mut self, path: &str) {
        let path = path.trim_matches('/');
        if path.is_empty() || self.dirs.contains(path) {
            return;
        }
        self.parents(path);
        self.dirs.insert(path.to_string());
        self.entry(path, S_IFDIR | 0o755, (0, 0), &[]);
    }

    /// A regular file with permission bits `mode`, after its parent directories.
    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        let path = path.trim_start_matches('/');
        self.parents(path);
        self.entry(path, S_IFREG | mode, (0, 0), data);
    }

    /// A character device node `(major, minor)` with permission bits `mode`.
    pub fn char_device(&mut self, path: &str, mode: u32, rdev: (u32, u32)) {
        let path = path.trim_start_matches('/');
        self.parents(path);
        self.entry(path, S_IFCHR | mode, rdev, &[]);
    }

    /// The archive with its trailer, or the first entry that did not fit
    /// newc (a file of 4 GiB or more).
    pub fn finish(mut self) -> io::Result<Vec<u8>> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        cpio::newc::trailer(self.out)
    }

    fn parents(&mut self, path: &str) {
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent);
        }
    }

    fn entry(&mut self, name: &str, mode: u32, (major, minor): (u32, u32), data: &[u8]) {
        if self.error.is_some() {
            return;
        }
        let Ok(size) = u32::try_from(data.len()) else {
            self.error = Some(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{name} is {} bytes, and a newc cpio entry holds under 4 GiB: leave it out \
                     of the initramfs",
                    data.len()
                ),
            ));
            return;
        };
        self.ino += 1;
        let mut w = cpio::newc::Builder::new(name)
            .ino(self.ino)
            .mode(mode)
            // A directory's "." and its entry in the parent.
            .nlink(if mode & S_IFDIR != 0 { 2 } else { 1 })
            .rdev_major(major)
            .rdev_minor(minor)
            .write(&mut self.out, size);
        // Writing into a Vec fails only past the size the header gave,
        // which is data's own length.
        if let Err(e) = w.write_all(data).and_then(|()| w.finish().map(drop)) {
            self.error = Some(e);
        }
    }
}

/// The archive: `/dev/console` (the kernel opens it for init's stdin,
/// stdout and stderr), `/proc` (the init mounts procfs there) and `/init`.
pub fn build(init: &[u8]) -> Vec<u8> {
    let mut a = Archive::default();
    a.dir("dev");
    a.char_device("dev/console", 0o600, (5, 1));
    a.dir("proc");
    a.file("init", 0o755, init);
    a.finish()
        .expect("the static init is linked into ptiscope, far under newc's 4 GiB")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One entry as read back.
    #[derive(Debug)]
    struct Read {
        name: String,
        ino: u32,
        mode: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: Vec<u8>,
    }

    /// Reads the archive back by the kernel's buffer-format.rst, not
    /// through the crate that wrote it: every entry before the trailer.
    fn parse(mut b: &[u8]) -> Vec<Read> {
        let mut v = Vec::new();
        let mut off = 0usize;
        loop {
            assert_eq!(&b[..6], b"070701", "at {off}");
            let field = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&b[6 + i * 8..14 + i * 8]).unwrap(), 16)
                    .unwrap()
            };
            let (size, namesize) = (field(6) as usize, field(11) as usize);
            let name = std::str::from_utf8(&b[110..110 + namesize - 1])
                .unwrap()
                .to_string();
            assert_eq!(b[110 + namesize - 1], 0, "{name}: the name ends in NUL");
            let data_start = (110 + namesize).next_multiple_of(4);
            let read = Read {
                name,
                ino: field(0),
                mode: field(1),
                nlink: field(4),
                rdev: (field(9), field(10)),
                data: b[data_start..data_start + size].to_vec(),
            };
            let next = (data_start + size).next_multiple_of(4);
            off += next;
            b = &b[next..];
            if read.name == "TRAILER!!!" {
                assert!(b.is_empty(), "nothing after the trailer");
                return v;
            }
            v.push(read);
        }
    }

    #[test]
    fn the_archive_holds_the_init_and_its_console() {
        let a = build(b"\x7fELF-ish init of odd length");
        assert_eq!(a.len() % 4, 0);
        let e = parse(&a);
        let names: Vec<&str> = e.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["dev", "dev/console", "proc", "init"]);
        let inos: Vec<u32> = e.iter().map(|x| x.ino).collect();
        assert_eq!(inos, [1, 2, 3, 4]);
        assert_eq!(e[3].data, b"\x7fELF-ish init of odd length");
        assert_eq!((e[3].mode, e[3].nlink), (S_IFREG | 0o755, 1));
        assert_eq!((e[1].mode, e[1].rdev), (S_IFCHR | 0o600, (5, 1)));
        assert_eq!((e[0].mode, e[0].nlink), (S_IFDIR | 0o755, 2));
    }

    #[test]
    fn the_archive_has_every_parent_directory_once() {
        let mut a = Archive::default();
        a.file("/usr/lib/x/libc.so.6", 0o755, b"abc");
        a.file("/usr/lib/x/libm.so.6", 0o755, b"abcd");
        a.char_device("/usr/lib/tty", 0o600, (4, 64));
        let out = a.finish().unwrap();
        assert_eq!(out.len() % 4, 0);
        let e = parse(&out);
        let names: Vec<&str> = e.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "usr",
                "usr/lib",
                "usr/lib/x",
                "usr/lib/x/libc.so.6",
                "usr/lib/x/libm.so.6",
                "usr/lib/tty"
            ]
        );
        assert_eq!(e[4].data, b"abcd");
        assert_eq!(e[5].rdev, (4, 64));
    }

    #[test]
    fn the_embedded_inits_are_static_elf_executables() {
        assert_eq!(&INIT_X86_64[..5], b"\x7fELF\x02", "ELF64");
        assert_eq!(&INIT_I386[..5], b"\x7fELF\x01", "ELF32");
    }
}
