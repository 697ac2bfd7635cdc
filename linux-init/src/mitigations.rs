//! The guest kernel's own word on its CPU-bug mitigations, for the report:
//! every file of `/sys/devices/system/cpu/vulnerabilities/` (one per bug the
//! kernel knows, each a line such as `Mitigation: PTI` or `Not affected`)
//! and the command line the kernel booted with, as machine lines:
//!
//! ```text
//! @kcmdline console=ttyS0 ... pti=auto workload=getppid iterations=2000
//! @vuln meltdown Mitigation: PTI
//! @vuln spectre_v2 Mitigation: Retpolines; IBPB: conditional; ...
//! @vulns files=14
//! ```
//!
//! or `@vuln none reason=...` where there is no such directory (a kernel
//! before 4.15, or one without CONFIG_GENERIC_CPU_VULNERABILITIES) or no
//! sysfs. The host parses them as guest text (vmm/src/linux/mitigations.rs):
//! everything here is bounded so that a strange kernel cannot make the init
//! print without end.
//!
//! Read before the measured phase: the reads and the mount are the init's,
//! not the measured loop's.

/// Where the kernel says what it does about each CPU bug
/// (drivers/base/cpu.c, `cpu_root_vulnerabilities_attrs`).
const DIR: &str = "/sys/devices/system/cpu/vulnerabilities";
/// Most files printed (Debian's 6.1 and 6.12 have 17; the rest are counted).
const MAX_FILES: usize = 64;
/// Most directory entries looked at.
const MAX_ENTRIES: usize = 256;
/// Bytes read of one file (sysfs gives at most a page).
const FILE_CAP: u64 = 4096;
/// Characters printed of one file's text (the longest, spectre_v2's, is
/// about 150 on 6.1).
const STATE_CAP: usize = 512;
/// Characters printed of a file's name.
const NAME_CAP: usize = 64;
/// Characters printed of the kernel command line (x86's COMMAND_LINE_SIZE
/// is 2048).
const CMDLINE_CAP: usize = 2048;

/// Prints the kernel command line and the vulnerabilities files as
/// machine lines (see the module's comment); never fails the run: what
/// cannot be read is said on the `@vuln none` line.
pub fn report(cmdline: &str) {
    println!("@kcmdline {}", printable(cmdline.trim(), CMDLINE_CAP));
    if let Err(e) = mount_sysfs() {
        println!(
            "@vuln none reason=no-sysfs:{}",
            e.raw_os_error().unwrap_or(0)
        );
        return;
    }
    let entries = match std::fs::read_dir(DIR) {
        Ok(d) => d,
        Err(e) => {
            // ENOENT: a kernel without the directory (before 4.15, or
            // built without CONFIG_GENERIC_CPU_VULNERABILITIES).
            println!(
                "@vuln none reason=no-vulnerabilities-directory:{}",
                e.raw_os_error().unwrap_or(0)
            );
            return;
        }
    };
    let mut names: Vec<String> = entries
        .take(MAX_ENTRIES)
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let files = names.len();
    for name in names.iter().take(MAX_FILES) {
        let path = format!("{DIR}/{name}");
        // A name is one word on the line: whitespace in it would split it.
        let shown: String = printable(name, NAME_CAP)
            .chars()
            .map(|c| if c == ' ' { '_' } else { c })
            .collect();
        match read_capped(&path) {
            Ok(text) => println!("@vuln {shown} {}", printable(text.trim(), STATE_CAP)),
            Err(e) => println!(
                "@vuln {shown} Unreadable: error {}",
                e.raw_os_error().unwrap_or(0)
            ),
        }
    }
    println!("@vulns files={files} shown={}", files.min(MAX_FILES));
}

/// Mounts sysfs at /sys (creating the directory); one already there is fine.
fn mount_sysfs() -> std::io::Result<()> {
    match crate::sys::mount_pseudo(c"sysfs", c"/sys") {
        // EBUSY: something (another part of the init) mounted it first.
        Err(e) if e.raw_os_error() == Some(16) => Ok(()),
        r => r,
    }
}

/// A file's text, at most [`FILE_CAP`] bytes, lossily UTF-8.
fn read_capped(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(FILE_CAP)
        .read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `s` on one line: control characters (a newline inside would start a
/// line of its own) as spaces, at most `cap` characters, `...` where cut.
fn printable(s: &str, cap: usize) -> String {
    let mut out: String = s
        .chars()
        .take(cap)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.chars().nth(cap).is_some() {
        out.push_str("...");
    }
    out
}
