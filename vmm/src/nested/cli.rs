//! The command line of `--backend nested`: which commands take it, the
//! inner command's arguments (the user's own, `--backend kvm` in place of
//! `nested`, output files redirected inside and copied back, input files
//! packed into the initramfs), its bound, and the hidden `nested-batch`
//! command the tests use to run many checks in one boot.

use std::path::PathBuf;
use std::time::Duration;

use super::{boot, Job, Request};
use crate::spec::nested::KvmPaging;

/// `eprintln!` for lines that carry user or file text: escaped line by line.
macro_rules! say {
    ($($t:tt)*) => {
        eprintln!("{}", $crate::cli::exit_code::escape_message(&format!($($t)*)))
    };
}
use crate::cli::exit_code;
use crate::cli::reproduce::ReproduceBackend;
use crate::cli::{Backend, Cli, Command, Runs};

/// Options that name a file the inner command writes.
const OUTPUT_OPTS: [&str; 5] = ["--json", "--csv", "--svg", "--serial-out", "--metrics-out"];
/// Options that name a file the inner command reads.
const INPUT_OPTS: [&str; 2] = ["--kernel", "--against"];
/// Options `--backend nested` does not take, with why.
const REFUSED_OPTS: [(&str, &str); 2] = [
    ("--qemu-arg", "--qemu-arg is for --backend qemu"),
    ("--no-plugin", "--no-plugin is for --backend qemu"),
];

/// The inner command: its arguments, the files it writes (inner path,
/// the user's path) and the files it reads (inner path, content).
#[derive(Debug, Default, PartialEq)]
pub struct Inner {
    /// The arguments after `ptiscope`.
    pub argv: Vec<String>,
    /// (inner path, outer path) of each output file.
    pub outputs: Vec<(String, PathBuf)>,
    /// (inner path, content) of each input file.
    pub inputs: Vec<(String, Vec<u8>)>,
}

/// Rewrites the user's arguments for the inner ptiscope. `json_is_flag`:
/// the command's `--json` takes no file (`probe`).
pub fn rewrite(raw: &[String], json_is_flag: bool) -> Result<Inner, String> {
    let mut inner = Inner::default();
    let mut it = raw.iter().peekable();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if let Some((_, why)) = REFUSED_OPTS.iter().find(|(o, _)| *o == name) {
            return Err(format!("--backend nested: {why}"));
        }
        if name == "--nested-paging" {
            // The outer ptiscope's: it loads the inner KVM so.
            if inline.is_none() {
                it.next();
            }
            continue;
        }
        let takes_file = (OUTPUT_OPTS.contains(&name) && !(json_is_flag && name == "--json"))
            || INPUT_OPTS.contains(&name);
        if name == "--backend" {
            let v = inline.or_else(|| it.next().cloned()).unwrap_or_default();
            let v = if v == "nested" { "kvm".to_string() } else { v };
            inner.argv.push(format!("--backend={v}"));
        } else if name == "--linux" {
            let Some(v) = inline.or_else(|| it.next().cloned()) else {
                inner.argv.push(arg.clone());
                continue;
            };
            let n = inner.outputs.len() + inner.inputs.len();
            let kernel = pack_linux(&v, n, &mut inner.inputs)?;
            inner.argv.push(format!("--linux={kernel}"));
        } else if takes_file {
            let Some(v) = inline.or_else(|| it.next().cloned()) else {
                inner.argv.push(arg.clone());
                continue;
            };
            let n = inner.outputs.len() + inner.inputs.len();
            let leaf = std::path::Path::new(&v)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| "file".into());
            if OUTPUT_OPTS.contains(&name) {
                let path = format!("/tmp/out/{n}-{leaf}");
                inner.outputs.push((path.clone(), PathBuf::from(&v)));
                inner.argv.push(format!("{name}={path}"));
            } else {
                let bytes = std::fs::read(&v).map_err(|e| format!("{name} {v}: {e}"))?;
                let path = format!("/nested/in/{n}-{leaf}");
                inner.inputs.push((path.clone(), bytes));
                inner.argv.push(format!("{name}={path}"));
            }
        } else {
            inner.argv.push(arg.clone());
        }
    }
    Ok(inner)
}

/// Packs `--linux VALUE`'s kernel (a known name's cached image, or a
/// path) into `inputs` under `/nested/in/N-linux/`, with the `config`
/// beside it (the inner preflight reads CONFIG_PAGE_TABLE_ISOLATION
/// there), and returns the packed kernel's inner path: the inner ptiscope
/// boots it on its VMM (`--backend kvm`).
fn pack_linux(v: &str, n: usize, inputs: &mut Vec<(String, Vec<u8>)>) -> Result<String, String> {
    let path = crate::preflight::linux::kernel_path(v).map_err(|e| e.to_string())?;
    let bytes = std::fs::read(&path).map_err(|e| format!("--linux {v}: {e}"))?;
    let dir = format!("/nested/in/{n}-linux");
    let leaf = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "vmlinuz".into());
    if let Some(config) = path
        .parent()
        .map(|d| d.join("config"))
        .and_then(|c| std::fs::read(c).ok())
    {
        inputs.push((format!("{dir}/config"), config));
    }
    let kernel = format!("{dir}/{leaf}");
    inputs.push((kernel.clone(), bytes));
    Ok(kernel)
}

/// Where the inner command finds the kernels [`pack_linux_cache`] packs
/// (its `PTISCOPE_LINUX_CACHE`).
const INNER_LINUX_CACHE: &str = "/nested/linux-cache";

/// Packs known kernels (name, cached image) as the inner command's kernel
/// cache: each image with the `config` beside it, under
/// [`INNER_LINUX_CACHE`]`/NAME/`.
fn pack_linux_cache(
    kernels: &[(&str, PathBuf)],
    inputs: &mut Vec<(String, Vec<u8>)>,
) -> Result<(), String> {
    for (name, image) in kernels {
        let bytes = std::fs::read(image).map_err(|e| format!("{}: {e}", image.display()))?;
        let dir = format!("{INNER_LINUX_CACHE}/{name}");
        if let Some(config) = image
            .parent()
            .and_then(|d| std::fs::read(d.join("config")).ok())
        {
            inputs.push((format!("{dir}/config"), config));
        }
        inputs.push((format!("{dir}/vmlinuz"), bytes));
    }
    Ok(())
}

/// The batch's jobs with each `--linux VALUE` packed (once per value) and
/// named by its packed path, and the files to pack.
fn pack_batch_linux(request: &mut Request) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut inputs = Vec::new();
    let mut packed: Vec<(String, String)> = Vec::new();
    for job in &mut request.jobs {
        let mut argv = Vec::with_capacity(job.argv.len());
        let mut it = std::mem::take(&mut job.argv).into_iter();
        while let Some(a) = it.next() {
            let v = match a.strip_prefix("--linux=") {
                Some(v) => v.to_string(),
                None if a == "--linux" => it.next().unwrap_or_default(),
                None => {
                    argv.push(a);
                    continue;
                }
            };
            let inner = match packed.iter().find(|(k, _)| *k == v) {
                Some((_, p)) => p.clone(),
                None => {
                    let p = pack_linux(&v, packed.len(), &mut inputs)?;
                    packed.push((v, p.clone()));
                    p
                }
            };
            argv.push(format!("--linux={inner}"));
        }
        job.argv = argv;
    }
    Ok(inputs)
}

/// The inner KVM's paging: as asked, else shadow paging for a Linux guest
/// (KVM's `tlb_flush` then counts its CR3 writes, which nothing else on
/// the VMM can) where the outer QEMU runs it correctly
/// ([`boot::shadow_paging_works`]), else nested paging.
fn kvm_paging(asked: Option<KvmPaging>, linux: bool) -> KvmPaging {
    asked.unwrap_or(if linux && boot::shadow_paging_works().is_ok() {
        KvmPaging::Shadow
    } else {
        KvmPaging::Npt
    })
}

/// Runs `cli`'s command under `--backend nested` if it asks for it: the
/// exit status, or `None` when the command runs here as usual.
pub fn intercept(cli: &Cli) -> Option<i32> {
    // (asked with --nested-paging, whether the guest is Linux).
    let mut paging: (Option<KvmPaging>, bool) = (None, false);
    // The Linux kernels `reproduce` measures, packed as the inner cache.
    let mut linux_cache: Vec<(&str, PathBuf)> = Vec::new();
    let (backend, name, bound, cpus, json_is_flag, quiet) = match &cli.command {
        Some(Command::Run(a)) => {
            paging = (a.on.nested_paging, a.linux.linux.is_some());
            (
                a.on.backend,
                "run",
                a.timeout + Duration::from_secs(60),
                a.cpus,
                false,
                false,
            )
        }
        Some(Command::Compare(a)) => {
            let runs = match a.runs {
                Runs::Fixed(n) => n,
                Runs::Auto => a.max_runs.unwrap_or(crate::cli::DEFAULT_MAX_RUNS),
            };
            let sides = 2 * (runs + a.warmup) + 2;
            paging = (a.target.on.nested_paging, a.target.linux.linux.is_some());
            (
                a.target.on.backend,
                "compare",
                a.exp.timeout * sides + Duration::from_secs(120),
                a.exp.cpus,
                false,
                a.quiet,
            )
        }
        Some(Command::Sweep(a)) => {
            // Every run of the grid is bounded by --timeout: the session's
            // bound is that many runs (an upper bound: wss=0 is one cell).
            let count = |list: &str| list.split(',').filter(|w| !w.trim().is_empty()).count();
            let cells = count(&a.wss).max(1) * count(&a.touches).max(1) + 1;
            let runs = cells as u32 * (a.configs.len().max(2) as u32) * a.runs.max(1);
            paging = (a.target.on.nested_paging, a.target.linux.linux.is_some());
            (
                a.target.on.backend,
                "sweep",
                a.exp.timeout * runs + Duration::from_secs(120),
                a.exp.cpus,
                false,
                a.quiet,
            )
        }
        Some(Command::Probe(a)) => (a.backend, "probe", Duration::from_secs(300), 1, true, false),
        // reproduce takes `auto` too: only `nested` is intercepted, and
        // the inner command is `reproduce --backend kvm` over the cells.
        Some(Command::Reproduce(a)) if a.backend == ReproduceBackend::Nested => {
            match crate::cli::reproduce::nested_session(a) {
                Ok((bound, cpus, kernels)) => {
                    // Nested paging even with Linux cells: under shadow
                    // paging the companion's 300,000-call PTI cells take
                    // over --timeout (each CR3 access exits).
                    linux_cache = kernels;
                    (Backend::Nested, "reproduce", bound, cpus, false, false)
                }
                Err(e) => {
                    say!("ptiscope reproduce: {e}");
                    return Some(exit_code::USAGE);
                }
            }
        }
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
            return Some(exit_code::USAGE);
        }
    };
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
    if !linux_cache.is_empty() {
        if let Err(e) = pack_linux_cache(&linux_cache, &mut inner.inputs) {
            say!("ptiscope {name}: {e}");
            return Some(exit_code::USAGE);
        }
        env.push((
            "PTISCOPE_LINUX_CACHE".to_string(),
            INNER_LINUX_CACHE.to_string(),
        ));
    }
    let request = Request {
        kvm_paging: kvm_paging(paging.0, paging.1),
        jobs: vec![Job {
            argv: inner.argv.clone(),
            collect: inner.outputs.iter().map(|(i, _)| i.clone()).collect(),
            timeout_secs: bound.as_secs_f64(),
            env,
            ..Default::default()
        }],
    };
    // A user's command only: the tests' batches choose their own.
    let mut cpus = cpus;
    if request.jobs.iter().any(Job::boots_linux) {
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
    let mut request: Request = match std::fs::read(&args.request)
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
        Ok(i) => i,
        Err(e) => {
            say!("ptiscope nested-batch: {e}");
            return exit_code::NO_IMAGE;
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
    let mut extra = boot::Extra {
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
        let bytes = match std::fs::read(&abs) {
            Ok(b) => b,
            Err(e) => {
                say!("ptiscope nested-exec: reading {}: {e}", abs.display());
                return exit_code::NO_IMAGE;
            }
        };
        match boot::needed_libraries(&abs) {
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
        .unwrap_err();
        assert!(e.contains("--qemu-arg"), "{e}");
        let e = rewrite(&s(&["run", "--kernel", "/nonexistent/k.elf"]), false).unwrap_err();
        assert!(e.contains("/nonexistent/k.elf"), "{e}");
        let e = rewrite(&s(&["run", "--linux", "/nonexistent/bzImage"]), false).unwrap_err();
        assert!(e.contains("/nonexistent/bzImage"), "{e}");
    }

    /// `reproduce --backend nested` is refused before any boot without
    /// `--no-linux` (exit 64); `auto`/`kvm`/`qemu` run here as usual.
    #[test]
    fn reproduce_is_intercepted_only_for_nested_and_refused_with_nothing_to_measure() {
        use clap::Parser as _;
        let cli =
            |w: &[&str]| Cli::try_parse_from(["ptiscope", "reproduce"].iter().chain(w)).unwrap();
        assert_eq!(
            intercept(&cli(&[
                "petkov-2015",
                "--backend",
                "nested",
                "--no-linux",
                "--no-companion"
            ])),
            Some(exit_code::USAGE)
        );
        for b in ["auto", "kvm", "qemu"] {
            assert_eq!(
                intercept(&cli(&["petkov-2015", "--backend", b])),
                None,
                "{b}"
            );
        }
        assert_eq!(intercept(&cli(&["petkov-2015"])), None);
        let i = rewrite(
            &s(&[
                "reproduce",
                "roedel-2018",
                "--backend",
                "nested",
                "--no-linux",
                "--json",
                "/x/r.json",
            ]),
            false,
        )
        .unwrap();
        assert_eq!(
            i.argv,
            s(&[
                "reproduce",
                "roedel-2018",
                "--backend=kvm",
                "--no-linux",
                "--json=/tmp/out/0-r.json"
            ])
        );
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
                "--linux=/nested/in/0-linux/vmlinuz",
                "--workload=getppid"
            ])
        );
        assert_eq!(
            i.inputs,
            vec![
                (
                    "/nested/in/0-linux/config".to_string(),
                    b"CONFIG_PAGE_TABLE_ISOLATION=y\n".to_vec()
                ),
                ("/nested/in/0-linux/vmlinuz".to_string(), b"kernel".to_vec())
            ]
        );
    }
}
