//! The command line of `--backend nested`: which commands take it, the
//! inner command's arguments (the user's own, `--backend kvm` in place of
//! `nested`, output files redirected inside and copied back, input files
//! packed into the initramfs), its bound, and the hidden `nested-batch`
//! command the tests use to run many checks in one boot.

use std::time::Duration;

use super::pack::{pack_batch_linux, pack_linux_cache, rewrite, Packer, INNER_LINUX_CACHE};
use super::{boot, payload, Job, Request};
use crate::input::{read_regular, READ_TIME_LIMIT};
use crate::machine::loader::MAX_IMAGE_BYTES;
use crate::spec::nested::KvmPaging;

/// `eprintln!` for lines that carry user or file text: escaped line by line.
macro_rules! say {
    ($($t:tt)*) => {
        eprintln!("{}", $crate::cli::exit_code::escape_message(&format!($($t)*)))
    };
}
use crate::cli::exit_code;
use crate::cli::{Backend, Cli, Command};

/// The inner KVM's paging: as asked, else shadow paging for a Linux guest
/// (KVM's `tlb_flush` then counts its CR3 writes, which nothing else on
/// the VMM can) where the outer QEMU runs it correctly
/// ([`boot::shadow_paging_works`]), else nested paging.
pub fn kvm_paging(asked: Option<KvmPaging>, linux: bool) -> KvmPaging {
    asked.unwrap_or(if linux && boot::shadow_paging_works().is_ok() {
        KvmPaging::Shadow
    } else {
        KvmPaging::Npt
    })
}

/// The most bytes of a `nested-batch` request read (a JSON list of jobs).
const MAX_REQUEST_BYTES: u64 = 16 << 20;

/// Runs `cli`'s command under `--backend nested` if it asks for it: the
/// exit status, or `None` when the command runs here as usual.
pub fn intercept(cli: &Cli) -> Option<i32> {
    // (asked with --nested-paging, whether the guest is Linux).
    let mut paging: (Option<KvmPaging>, bool) = (None, false);
    let (backend, name, bound, cpus, json_is_flag, quiet) = match &cli.command {
        // `run`, `compare`, `sweep`, `reproduce` and `ledger` go through
        // the backend trait (`backend::Nested`, its `--nested-paging` its
        // own option).
        Some(
            Command::Run(_)
            | Command::Compare(_)
            | Command::Sweep(_)
            | Command::Reproduce(_)
            | Command::Ledger(_),
        ) => return None,
        Some(Command::Probe(a)) => (a.backend, "probe", Duration::from_secs(300), 1, true, false),
        Some(Command::Pagetables(a)) => (
            a.backend,
            "pagetables",
            Duration::from_secs(120),
            1,
            false,
            false,
        ),
        _ => return None,
    };
    match (backend, name) {
        (Backend::Qemu, "probe" | "pagetables") => {
            eprintln!(
                "ptiscope {name}: --backend qemu has no KVM to {name}: use --backend kvm (this host's) \
                 or --backend nested (kvm_amd inside QEMU TCG)"
            );
            return Some(exit_code::USAGE);
        }
        (Backend::Nested, _) => {}
        _ if paging.0.is_some() => {
            eprintln!(
                "ptiscope {name}: --nested-paging is for --backend nested (it sets how the inner \
                 kvm_amd maps guest memory): drop it, or add --backend nested"
            );
            return Some(exit_code::USAGE);
        }
        _ => return None,
    }
    let raw: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut inner = match rewrite(&raw, json_is_flag) {
        Ok(i) => i,
        Err(e) => {
            say!("ptiscope {name}: {e}");
            return Some(e.exit_code());
        }
    };
    paging.1 |= inner.boots_linux;
    for (_, outer) in &inner.outputs {
        let parent = outer.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.is_dir()) {
            say!(
                "ptiscope {name}: cannot write {}: its directory does not exist",
                outer.display()
            );
            return Some(exit_code::CANT_CREATE);
        }
    }
    let mut env = Vec::new();
    if inner.linux_cache {
        if let Err(e) = pack_linux_cache(&[], &mut inner.inputs) {
            say!("ptiscope {name}: {e}");
            return Some(e.exit_code());
        }
        env.push((
            "PTISCOPE_LINUX_CACHE".to_string(),
            INNER_LINUX_CACHE.to_string(),
        ));
    }
    let kvm_paging = kvm_paging(paging.0, paging.1);
    let job = Job {
        argv: inner.argv.clone(),
        collect: inner.outputs.iter().map(|(i, _)| i.clone()).collect(),
        timeout_secs: bound.as_secs_f64(),
        env,
        ..Default::default()
    };
    // The outer QEMU's plugin counts a Linux guest's CR3 writes where the
    // inner KVM cannot (nested paging): `--linux`, a side's `linux=`, or
    // `reproduce`'s Linux cells (its packed kernel cache).
    let linux = paging.1 || job.boots_linux();
    let request = Request {
        kvm_paging,
        outer_plugin: Some(linux && kvm_paging == KvmPaging::Npt),
        jobs: vec![job],
        serve: false,
    };
    // A user's command only: the tests' batches choose their own.
    let mut cpus = cpus;
    if paging.1 || request.jobs.iter().any(Job::boots_linux) {
        // One outer vCPU under a Linux guest on the VMM, whatever its
        // --cpus: with two, 3 of 3 two-vCPU Linux boots stalled (two at
        // "x86: Booting SMP configuration"), with one 8 of 8 reached the
        // init (docs/linux-guests.md).
        cpus = 1;
    }
    let mut progress = |m: &str| {
        if !quiet {
            eprintln!("ptiscope {name}: {m}");
        }
    };
    let response = match boot::run(&request, &inner.inputs, cpus, &mut progress) {
        Ok(r) => r,
        Err(e) => {
            say!("ptiscope {name} --backend nested: {e}");
            return Some(e.exit_code());
        }
    };
    let Some(job) = response.jobs.first() else {
        eprintln!("ptiscope {name} --backend nested: the inner Linux ran no command");
        return Some(exit_code::INTERNAL);
    };
    print!("{}", job.stdout);
    eprint!("{}", job.stderr);
    for (inner_path, outer) in &inner.outputs {
        if let Some((_, content)) = job.files.iter().find(|(p, _)| p == inner_path) {
            if let Err(e) = std::fs::write(outer, content) {
                say!("ptiscope {name}: writing {}: {e}", outer.display());
                return Some(exit_code::CANT_CREATE);
            }
        }
    }
    Some(job.status)
}

/// Runs `nested-batch` ([`crate::cli::NestedBatchArgs`]).
pub fn batch(args: &crate::cli::NestedBatchArgs) -> i32 {
    let mut request: Request = match read_regular(
        "nested-batch request",
        &args.request,
        MAX_REQUEST_BYTES,
        READ_TIME_LIMIT,
    )
    .map_err(|e| e.to_string())
    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(r) => r,
        Err(e) => {
            say!("ptiscope nested-batch: {}: {e}", args.request.display());
            return exit_code::USAGE;
        }
    };
    let inputs = match pack_batch_linux(&mut request) {
        Ok(Packer { inputs, cache, .. }) => {
            if cache {
                for job in &mut request.jobs {
                    job.env.push((
                        "PTISCOPE_LINUX_CACHE".to_string(),
                        INNER_LINUX_CACHE.to_string(),
                    ));
                }
            }
            inputs
        }
        Err(e) => {
            say!("ptiscope nested-batch: {e}");
            return e.signal().map_or(exit_code::NO_IMAGE, |s| 128 + s);
        }
    };
    match boot::run(&request, &inputs, args.cpus, &mut |m| {
        eprintln!("ptiscope nested-batch: {m}")
    }) {
        Ok(r) => {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            0
        }
        Err(e) => {
            say!("ptiscope nested-batch: {e}");
            e.exit_code()
        }
    }
}

/// Runs `nested-exec` ([`crate::cli::NestedExecArgs`]): 0 when every executable exited 0, 1 when one did
/// not, else why the session failed.
pub fn exec(args: &crate::cli::NestedExecArgs) -> i32 {
    let mut extra = payload::Extra {
        memory_mib: args.memory_mib,
        ..Default::default()
    };
    let mut jobs = Vec::new();
    let env: Vec<(String, String)> = match args
        .env
        .iter()
        .map(|e| {
            e.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| format!("--env {e}: give NAME=VALUE"))
        })
        .collect::<Result<_, _>>()
    {
        Ok(e) => e,
        Err(e) => {
            say!("ptiscope nested-exec: {e}");
            return exit_code::USAGE;
        }
    };
    for (n, path) in args.exes.iter().chain(&args.place).enumerate() {
        let abs = match std::path::absolute(path) {
            Ok(p) => p,
            Err(e) => {
                say!("ptiscope nested-exec: {}: {e}", path.display());
                return exit_code::USAGE;
            }
        };
        let bytes = match read_regular("nested-exec file", &abs, MAX_IMAGE_BYTES, READ_TIME_LIMIT) {
            Ok(b) => b,
            Err(e) => {
                say!("ptiscope nested-exec: {e}");
                return e.signal().map_or(exit_code::NO_IMAGE, |s| 128 + s);
            }
        };
        match payload::needed_libraries(&abs) {
            Ok(libs) => {
                for l in libs {
                    if !extra.libraries.contains(&l) {
                        extra.libraries.push(l);
                    }
                }
            }
            Err(e) => {
                say!("ptiscope nested-exec: {e}");
                return exit_code::NO_IMAGE;
            }
        }
        let inner = abs.to_string_lossy().into_owned();
        if n < args.exes.len() {
            jobs.push(Job {
                argv: args.args.clone(),
                timeout_secs: args.timeout,
                exe: Some(inner.clone()),
                env: env.clone(),
                cwd: args.cwd.clone(),
                ..Default::default()
            });
        }
        extra.executables.push((inner, bytes));
    }
    let request = Request {
        jobs,
        ..Default::default()
    };
    let response = match boot::run_with(&request, &[], &extra, args.cpus, &mut |m| {
        eprintln!("ptiscope nested-exec: {m}")
    }) {
        Ok(r) => r,
        Err(e) => {
            say!("ptiscope nested-exec: {e}");
            return e.exit_code();
        }
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&response).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text + "\n") {
            say!("ptiscope nested-exec: writing {}: {e}", path.display());
            return exit_code::CANT_CREATE;
        }
    }
    let mut failed = Vec::new();
    for (exe, job) in args.exes.iter().zip(&response.jobs) {
        let name = exe
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        println!(
            "==== {name}: exit {} after {:.1} s (TCG time)",
            job.status, job.secs
        );
        print!("{}", job.stdout);
        if !job.stderr.is_empty() {
            println!("---- {name}: stderr");
            print!("{}", job.stderr);
        }
        if job.status != 0 {
            failed.push(format!("{name} (exit {})", job.status));
        }
    }
    println!(
        "==== nested-exec: {} of {} executables exited 0{}{}",
        response.jobs.len() - failed.len(),
        args.exes.len(),
        if failed.is_empty() { "" } else { "; not: " },
        failed.join(", ")
    );
    i32::from(!failed.is_empty() || response.jobs.len() != args.exes.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn the_inner_command_runs_on_kvm_with_its_files_redirected() {
        let i = rewrite(
            &s(&[
                "compare",
                "--backend",
                "nested",
                "--json",
                "/x/r.json",
                "--csv=out.csv",
                "--runs",
                "2",
            ]),
            false,
        )
        .unwrap();
        assert_eq!(
            i.argv,
            s(&[
                "compare",
                "--backend=kvm",
                "--json=/tmp/out/0-r.json",
                "--csv=/tmp/out/1-out.csv",
                "--runs",
                "2"
            ])
        );
        assert_eq!(
            i.outputs,
            vec![
                ("/tmp/out/0-r.json".to_string(), PathBuf::from("/x/r.json")),
                ("/tmp/out/1-out.csv".to_string(), PathBuf::from("out.csv"))
            ]
        );
        // probe's --json is a flag.
        let i = rewrite(&s(&["probe", "--backend=nested", "--json"]), true).unwrap();
        assert_eq!(i.argv, s(&["probe", "--backend=kvm", "--json"]));
        assert!(i.outputs.is_empty());
    }

    #[test]
    fn nested_paging_is_the_outer_ptiscopes_and_not_passed_in() {
        for args in [
            &[
                "run",
                "--backend",
                "nested",
                "--nested-paging",
                "shadow",
                "--pti",
                "on",
            ][..],
            &[
                "run",
                "--nested-paging=npt",
                "--backend=nested",
                "--pti",
                "on",
            ],
        ] {
            let i = rewrite(&s(args), false).unwrap();
            assert!(
                !i.argv
                    .iter()
                    .any(|a| a.contains("paging") || a == "shadow" || a == "npt"),
                "{:?}",
                i.argv
            );
            assert!(i.argv.contains(&"--pti".to_string()), "{:?}", i.argv);
        }
        assert_eq!(kvm_paging(Some(KvmPaging::Npt), true), KvmPaging::Npt);
        assert_eq!(
            kvm_paging(Some(KvmPaging::Shadow), false),
            KvmPaging::Shadow
        );
        assert_eq!(kvm_paging(None, false), KvmPaging::Npt);
    }

    #[test]
    fn options_for_other_backends_are_refused_by_name() {
        let e = rewrite(
            &s(&["run", "--backend", "nested", "--qemu-arg=-icount"]),
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--qemu-arg"), "{e}");
        let e = rewrite(&s(&["run", "--kernel", "/nonexistent/k.elf"]), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/k.elf"), "{e}");
        let e = rewrite(&s(&["run", "--linux", "/nonexistent/bzImage"]), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/bzImage"), "{e}");
    }

    /// Every file the inner command would read is read here through the
    /// bounded reader: a FIFO (no writer) as `--kernel`, `--linux`, a
    /// side's `linux=`, `--against` or the configuration beside a kernel
    /// is refused at once, named, with exit 64; never a blocked open.
    #[test]
    fn fifos_among_the_inputs_are_refused_at_once_naming_them() {
        let d = std::env::temp_dir().join(format!("ptiscope-nested-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("k")).unwrap();
        let mkfifo = |p: &std::path::Path| {
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        };
        let fifo = d.join("fifo");
        mkfifo(&fifo);
        // A kernel whose configuration is a FIFO.
        std::fs::write(d.join("k/vmlinuz"), b"kernel").unwrap();
        mkfifo(&d.join("k/config"));
        let f = fifo.display().to_string();
        let k = d.join("k/vmlinuz").display().to_string();
        let t = std::time::Instant::now();
        for (args, named) in [
            (vec!["run", "--kernel", &f], f.clone()),
            (vec!["run", "--linux", &f], f.clone()),
            (vec!["compare", "--against", &f], f.clone()),
            (
                vec!["compare", "--baseline", &format!("pti=off,linux={f}")],
                f.clone(),
            ),
            (
                vec!["run", "--linux", &k],
                d.join("k/config").display().to_string(),
            ),
            (
                vec!["sweep", &format!("--config=linux={k}")],
                d.join("k/config").display().to_string(),
            ),
        ] {
            let mut argv = s(&args);
            argv.insert(1, "--backend=nested".into());
            let e = rewrite(&argv, false).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains(&named) && text.contains("FIFO"),
                "{args:?}: {text}"
            );
            assert_eq!(e.exit_code(), exit_code::USAGE, "{args:?}");
        }
        assert!(t.elapsed() < Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A side's `linux=` is packed as `--linux` is (each kernel once),
    /// the side's other words kept; both sides naming one path share it.
    #[test]
    fn side_kernels_are_packed_as_linux_kernels_are() {
        let d = std::env::temp_dir().join(format!("ptiscope-nested-side-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vmlinuz-6.12.0-x"), b"kernel").unwrap();
        std::fs::write(
            d.join("config-6.12.0-x"),
            b"CONFIG_MITIGATION_PAGE_TABLE_ISOLATION=y\n",
        )
        .unwrap();
        let k = d.join("vmlinuz-6.12.0-x").display().to_string();
        let i = rewrite(
            &s(&[
                "compare",
                "--backend=nested",
                "--baseline",
                &format!("linux={k},append=pti=off"),
                &format!("--compare=append=pti=on, linux= {k}"),
            ]),
            false,
        )
        .unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(
            i.argv,
            s(&[
                "compare",
                "--backend=kvm",
                "--baseline=linux=/nested/in/kernel-0/vmlinuz-6.12.0-x,append=pti=off",
                "--compare=append=pti=on, linux=/nested/in/kernel-0/vmlinuz-6.12.0-x",
            ])
        );
        // Debian's config-RELEASE is packed as `config` beside the copy.
        assert_eq!(
            i.inputs,
            vec![
                (
                    "/nested/in/kernel-0/config".to_string(),
                    b"CONFIG_MITIGATION_PAGE_TABLE_ISOLATION=y\n".to_vec()
                ),
                (
                    "/nested/in/kernel-0/vmlinuz-6.12.0-x".to_string(),
                    b"kernel".to_vec()
                )
            ]
        );
        assert!(i.boots_linux && !i.linux_cache);
        // Sides without a kernel are left alone.
        let i = rewrite(
            &s(&["compare", "--baseline", "pti=off", "--compare", "pti=on"]),
            false,
        )
        .unwrap();
        assert_eq!(
            i.argv,
            s(&["compare", "--baseline=pti=off", "--compare=pti=on"])
        );
        assert!(!i.boots_linux && i.inputs.is_empty());
    }

    /// `run`, `compare` and `sweep` are not re-run inside: they go through
    /// the backend trait; a misplaced `--nested-paging` (the nested
    /// backend's own option) is refused by the commands' one refusal.
    #[test]
    fn run_and_compare_are_not_intercepted() {
        use clap::Parser as _;
        for args in [
            &["run", "--backend", "nested", "--linux", "x", "--by-symbol"][..],
            &["compare", "--backend", "nested", "--by-symbol"],
            &["compare", "--backend=nested", "--nested-paging", "shadow"],
            &["sweep", "--backend", "nested", "--config", "bogus=1"],
        ] {
            let cli = Cli::try_parse_from(std::iter::once(&"ptiscope").chain(args)).unwrap();
            assert_eq!(intercept(&cli), None, "{args:?}");
        }
        for args in [
            &["run", "--nested-paging", "npt"][..],
            &["compare", "--backend=qemu", "--nested-paging=shadow"],
            &["sweep", "--nested-paging", "npt"],
        ] {
            let cli = Cli::try_parse_from(std::iter::once(&"ptiscope").chain(args)).unwrap();
            assert_eq!(intercept(&cli), None, "{args:?}");
            let why = match &cli.command {
                Some(Command::Run(a)) => a.backend_mismatch(),
                Some(Command::Compare(a)) => a.target.on.refusal(&a.target.on.requested()),
                Some(Command::Sweep(a)) => a.target.on.refusal(&a.target.on.requested()),
                _ => unreachable!(),
            };
            assert_eq!(
                why.as_deref(),
                Some("--nested-paging needs --backend nested"),
                "{args:?}"
            );
        }
    }

    /// `reproduce` is never re-run inside: every backend, `nested` too,
    /// measures its cells through the backend trait.
    #[test]
    fn reproduce_is_not_intercepted() {
        use clap::Parser as _;
        let cli =
            |w: &[&str]| Cli::try_parse_from(["ptiscope", "reproduce"].iter().chain(w)).unwrap();
        for b in ["auto", "kvm", "qemu", "nested"] {
            assert_eq!(
                intercept(&cli(&["petkov-2015", "--backend", b, "--no-linux"])),
                None,
                "{b}"
            );
        }
        assert_eq!(intercept(&cli(&["petkov-2015"])), None);
    }

    /// `--linux` packs the kernel with the configuration beside it and
    /// names the packed copy to the inner command.
    #[test]
    fn a_linux_kernel_is_packed_with_its_configuration() {
        let d = std::env::temp_dir().join(format!("ptiscope-nested-linux-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vmlinuz"), b"kernel").unwrap();
        std::fs::write(d.join("config"), b"CONFIG_PAGE_TABLE_ISOLATION=y\n").unwrap();
        let k = d.join("vmlinuz").display().to_string();
        let i = rewrite(
            &s(&[
                "run",
                "--backend=nested",
                "--linux",
                &k,
                "--workload=getppid",
            ]),
            false,
        )
        .unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(
            i.argv,
            s(&[
                "run",
                "--backend=kvm",
                "--linux=/nested/in/kernel-0/vmlinuz",
                "--workload=getppid"
            ])
        );
        assert_eq!(
            i.inputs,
            vec![
                (
                    "/nested/in/kernel-0/config".to_string(),
                    b"CONFIG_PAGE_TABLE_ISOLATION=y\n".to_vec()
                ),
                (
                    "/nested/in/kernel-0/vmlinuz".to_string(),
                    b"kernel".to_vec()
                )
            ]
        );
    }
}
