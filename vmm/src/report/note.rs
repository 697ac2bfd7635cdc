//! A run summary's notes as data: each a [`Note`], a `code` and its
//! parameters, whose words are its `Display`, written here and nowhere
//! else. The run document carries each note as `{"code", its parameters,
//! "text"}` (docs/report-json.md, "Notes"); code that looks for a note
//! matches its variant, never its text.

use serde::{Deserialize, Serialize};

/// Which guest's calls a summary's rates divide by, and why that count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Divisor {
    /// The workload's N iterations plus the phase-marker syscall.
    Calls,
    /// poundsyscall: the getppid calls of all threads.
    PoundsyscallCalls,
    /// sched-messaging: the messages sent.
    Messages,
}

/// What a Linux guest's summary says the host checked of its PTI state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PtiHostCheck {
    /// The host's CR3 writes per system call agree with the kernel log.
    Agrees {
        /// Who observed (`qemu-plugin`, `kvm`).
        source: String,
        /// CR3 writes per system call the host saw.
        cr3_per_syscall: f64,
    },
    /// sched-messaging switches processes: CR3 is written with or without PTI.
    NoneForSchedMessaging,
    /// The QEMU plugin was off or saw no phase.
    NoPluginCount,
    /// On the VMM under nested paging: KVM does not intercept CR3 writes.
    NoNestedPagingCount,
}

/// The host a Linux guest's figures were taken on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinuxHost {
    /// QEMU TCG, with ptiscope's plugin.
    QemuTcg,
    /// ptiscope's VMM on KVM.
    Vmm,
}

/// One caveat of a run's summary, as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Note {
    /// What the per-call rates divide by.
    RateDivisor {
        /// Which count.
        divisor: Divisor,
        /// The workload's count as asked (iterations, calls, messages).
        iterations: u64,
        /// What the rates divide by.
        calls: u64,
    },
    /// The command line has words the guest's parser does not know.
    UnknownRequestedCount,
    /// The guest marked no complete workload phase.
    NoPhase,
    /// The VM did not start: no snapshots.
    NoSnapshots,
    /// The guest never initialised its telemetry page.
    TelemetryNotInitialized,
    /// The guest's telemetry is invalid: its rows are left out.
    TelemetryInvalid,
    /// With EPT/NPT KVM does not intercept guest CR3 writes.
    Cr3NotIntercepted,
    /// This KVM has no tlb_flush stat.
    NoTlbFlushStat,
    /// KVM's stats fds could not be read.
    KvmStatsUnavailable {
        /// Why.
        error: String,
    },
    /// A hardware-assisted KVM does not count kernel instructions.
    KernelInstructionsNotCounted,
    /// kvm_pvm emulates guest kernel code.
    KvmPvmEmulatesKernel,
    /// `--metrics-interval`'s sampler stopped.
    LiveMetricsStopped {
        /// Why.
        error: String,
    },
    /// Under `--no-plugin` the host observed nothing.
    PluginOff,
    /// The QEMU plugin wrote no counts.
    PluginMissing {
        /// Why.
        error: String,
    },
    /// The QEMU plugin's file was refused.
    PluginRefused {
        /// Why.
        error: String,
    },
    /// The QEMU plugin saw no phase.
    PluginNoPhase {
        /// Why.
        error: String,
    },
    /// Where the `[qemu-plugin]` rows come from.
    PluginRows {
        /// The plugin's API version.
        api: u64,
        /// Between the guest's phase markers (false: the whole run).
        phased: bool,
        /// The address ranges counted as the kernel's.
        kernel: String,
    },
    /// What a backend says of the figures of a run it did not observe
    /// from the host (its own words).
    Backend {
        /// The backend (`qemu`).
        backend: String,
        /// Its words.
        says: String,
    },
    /// The guest printed no `@result` line.
    NoResultLine,
    /// No workload ran: the guest only booted.
    OnlyBooted,
    /// A Linux guest's figures: whose, and what the rates divide by.
    LinuxGuest {
        /// `x86_64`, `i386`.
        arch: String,
        /// The kernel's version, if known.
        version: Option<String>,
        /// Where it ran.
        host: LinuxHost,
        /// What the rates divide by.
        calls: u64,
        /// What one is called (`call`, `message`).
        iteration_name: String,
    },
    /// PTI's state as the kernel log says, and the host's check of it.
    Pti {
        /// Whether PTI is enabled.
        enabled: bool,
        /// What the host checked.
        host_check: PtiHostCheck,
    },
    /// The PTI check failed.
    PtiCheckFailed {
        /// Why.
        error: String,
    },
    /// `--tick-free`/`nohz_full=`: where the loop ran and what ticked there.
    TickFree {
        /// `--tick-free` or `nohz_full= in --append`.
        asked_by: String,
        /// The CPU asked for (where the init did not say where it ran).
        asked_cpu: Option<u32>,
        /// The CPU the loop ran on (`None`: the init did not say, or could
        /// not pin it).
        cpu: Option<u32>,
        /// Whether the init printed its `@cpu` line.
        reported: bool,
        /// Whether the kernel keeps that CPU tick-free (full dynticks).
        dynticks: bool,
        /// Local timer interrupts there across the loop, if counted.
        ticks: Option<u64>,
    },
    /// The init marked its phase through the port with ioperm.
    PortMarkers {
        /// Why: `asked`, `kvm_i386`, or the kernel refused the mapping.
        why: PortMarkerReason,
        /// The port.
        port: u16,
    },
    /// `--timeout` stopped the guest after the init's `@result` line.
    MeasuredBeforeTimeout {
        /// The timeout, in milliseconds.
        after_ms: u64,
        /// Whether it was sending the kernel's symbols (`--by-symbol`).
        by_symbol: bool,
    },
    /// The init printed no `@result` line.
    InitNoResult,
    /// Under `--backend nested`, the `[qemu-plugin]` rows are the outer
    /// QEMU's plugin's, which counts only what its SVM runs in guest mode.
    OuterPluginRows,
    /// `--by-symbol` gave no table.
    BySymbolNone {
        /// Why.
        error: String,
    },
    /// An output's reader did not keep up: bytes were dropped.
    OutputDropped {
        /// The option (`console`, `--serial-out`, `--metrics-out`).
        output: String,
        /// Where it went.
        target: String,
        /// Bytes dropped.
        dropped_bytes: u64,
        /// In this many writes.
        dropped_chunks: u64,
        /// Bytes written.
        written_bytes: u64,
        /// The queue's size, in KiB.
        queue_kib: u64,
        /// The drain grace after the run, in seconds.
        drain_s: f64,
    },
    /// An output's write failed.
    OutputFailed {
        /// The option.
        output: String,
        /// Where it went.
        target: String,
        /// The error.
        error: String,
        /// Bytes written.
        written_bytes: u64,
        /// Bytes dropped.
        dropped_bytes: u64,
    },
}

/// Why the init marked its phase through the port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PortMarkerReason {
    /// `--append ptiscope.marker=port`.
    Asked,
    /// A 32-bit kernel on KVM.
    KvmI386,
    /// The kernel refused the `/dev/mem` mapping of the marker page.
    MappingRefused {
        /// The init's reason (sanitised).
        reason: String,
    },
}

impl Note {
    /// Whether this note says why the QEMU plugin gave no counts (off,
    /// missing, refused, or no phase).
    pub fn is_plugin_gap(&self) -> bool {
        matches!(
            self,
            Note::PluginOff
                | Note::PluginMissing { .. }
                | Note::PluginRefused { .. }
                | Note::PluginNoPhase { .. }
        )
    }

    /// The note of an output that dropped or failed, if it did either.
    pub fn of_output(o: &crate::output::OutputReport) -> Option<Note> {
        if let Some(e) = &o.error {
            return Some(Note::OutputFailed {
                output: o.what.clone(),
                target: o.target.clone(),
                error: e.clone(),
                written_bytes: o.written_bytes,
                dropped_bytes: o.dropped_bytes,
            });
        }
        (o.dropped_bytes > 0).then(|| Note::OutputDropped {
            output: o.what.clone(),
            target: o.target.clone(),
            dropped_bytes: o.dropped_bytes,
            dropped_chunks: o.dropped_chunks,
            written_bytes: o.written_bytes,
            queue_kib: (crate::output::QUEUE_BYTES >> 10) as u64,
            drain_s: crate::output::DRAIN_GRACE.as_secs_f64(),
        })
    }
}

impl std::fmt::Display for PtiHostCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PtiHostCheck::Agrees {
                source,
                cr3_per_syscall,
            } => write!(
                f,
                "the host ({source}) agrees: {cr3_per_syscall:.2} CR3 writes per system call"
            ),
            PtiHostCheck::NoneForSchedMessaging => write!(
                f,
                "no host-side check for sched-messaging: its context switches between \
                 processes write CR3 with or without PTI"
            ),
            PtiHostCheck::NoPluginCount => write!(
                f,
                "no host-side check (CR3 writes per system call seen by the QEMU plugin): the \
                 plugin was off or saw no phase (see its note)"
            ),
            PtiHostCheck::NoNestedPagingCount => write!(
                f,
                "no host-side CR3 count: under nested paging (NPT/EPT) KVM does not intercept \
                 the guest's CR3 writes (under shadow paging, and without PCID, its tlb_flush \
                 counts them: `--backend nested --nested-paging shadow`), so the kernel log's \
                 PTI state is the check"
            ),
        }
    }
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Note::RateDivisor {
                divisor: Divisor::PoundsyscallCalls,
                iterations,
                ..
            } => write!(
                f,
                "per-call rates divide by the {iterations} getppid calls of all threads \
                 (poundsyscall: the phase also holds each thread's exit, the parent's waits \
                 and the end marker, 2 x threads + 2 syscalls)"
            ),
            Note::RateDivisor {
                divisor: Divisor::Messages,
                iterations,
                ..
            } => write!(
                f,
                "per-message rates divide by the {iterations} messages sent (sched-messaging: \
                 each message is a write and a read, plus the workers' own start and exit)"
            ),
            Note::RateDivisor {
                divisor: Divisor::Calls,
                iterations,
                calls,
            } => write!(
                f,
                "per-call rates divide by {calls} calls: the {iterations} workload iterations plus \
                 the phase-marker syscall whose return and entry bracket the phase"
            ),
            Note::UnknownRequestedCount => write!(
                f,
                "the command line has words the ptiscope guest's parser does not know, so the \
                 VMM cannot tell how many calls it asked for: totals only, no per-call rates"
            ),
            Note::NoPhase => write!(
                f,
                "the guest marked no complete workload phase: figures cover the whole run, boot \
                 included"
            ),
            Note::NoSnapshots => write!(f, "no snapshots were taken (the VM did not start)"),
            Note::TelemetryNotInitialized => write!(
                f,
                "the guest never initialised its telemetry page: no guest counters"
            ),
            Note::TelemetryInvalid => write!(
                f,
                "guest telemetry INVALID: guest-reported rows are omitted; host-observed rows stand"
            ),
            Note::Cr3NotIntercepted => write!(
                f,
                "with EPT/NPT KVM does not intercept guest CR3 writes: cr3_writes are the guest's \
                 word only, and KVM tlb_flush counts KVM's own flushes"
            ),
            Note::NoTlbFlushStat => write!(
                f,
                "this KVM has no tlb_flush stat: guest CR3 writes cannot be cross-checked"
            ),
            Note::KvmStatsUnavailable { error } => {
                write!(f, "KVM stats fd not available: {error}")
            }
            Note::KernelInstructionsNotCounted => write!(
                f,
                "kernel_instructions: not counted by this KVM (hardware-assisted: guest kernel \
                 code runs natively, and KVM's insn_emulation counts only what it emulates)"
            ),
            Note::KvmPvmEmulatesKernel => write!(
                f,
                "kvm_pvm: guest kernel code is emulated, so kernel_instructions is the exact \
                 kernel path length and time is dominated by emulation"
            ),
            Note::LiveMetricsStopped { error } => write!(f, "live metrics stopped: {error}"),
            Note::PluginOff => write!(
                f,
                "QEMU plugin off (--no-plugin): the host observed nothing of the guest"
            ),
            Note::PluginMissing { error } => {
                write!(f, "QEMU plugin: no host-observed counts: {error}")
            }
            Note::PluginRefused { error } => write!(
                f,
                "QEMU plugin: its file was refused, no host-observed counts: {error}"
            ),
            Note::PluginNoPhase { error } => write!(
                f,
                "QEMU plugin: no in-phase counts ({error}); its whole-run totals are not shown as \
                 phase figures"
            ),
            Note::PluginRows {
                api,
                phased,
                kernel,
            } => write!(
                f,
                "[qemu-plugin] rows: counted inside QEMU by ptiscope's TCG plugin (API {api}), {} \
                 between the guest's phase-marker writes; kernel = instructions at {kernel}",
                if *phased {
                    "exactly"
                } else {
                    "whole run, firmware and boot included, not"
                },
            ),
            Note::Backend { says, .. } => write!(f, "{says}"),
            Note::NoResultLine => {
                write!(f, "the guest printed no @result line: nothing was measured")
            }
            Note::OnlyBooted => write!(
                f,
                "nothing measured per call: no workload ran, the guest only booted \
                 (--workload NAME runs one; --iterations N alone runs getpid)"
            ),
            Note::LinuxGuest {
                arch,
                version,
                host,
                calls,
                iteration_name,
            } => write!(
                f,
                "Linux guest ({arch}, {}) {} with ptiscope's init: [guest] figures are the \
                 init's @result line, {}; per-call rates divide by the {calls} {iteration_name}s \
                 of the phase, which the init's marker writes bracket",
                version.as_deref().unwrap_or("version unknown"),
                match host {
                    LinuxHost::QemuTcg => "under QEMU TCG",
                    LinuxHost::Vmm => "on ptiscope's VMM (KVM)",
                },
                match host {
                    LinuxHost::QemuTcg => "[qemu-plugin] ones counted by ptiscope's TCG plugin",
                    LinuxHost::Vmm =>
                        "[kvm] ones KVM's stats fds, [vmm] the VMM's exits to user space, \
                         [host-clock] the host's clock (hardware time on a hardware KVM host; \
                         under --backend nested the KVM is emulated by QEMU TCG, so every time \
                         is emulated time)",
                },
            ),
            Note::Pti {
                enabled,
                host_check,
            } => write!(
                f,
                "PTI {} (the kernel log, read by the init); {host_check}",
                if *enabled { "enabled" } else { "not enabled" }
            ),
            Note::PtiCheckFailed { error } => write!(f, "PTI check failed: {error}"),
            Note::TickFree {
                asked_by,
                asked_cpu,
                cpu,
                reported,
                dynticks,
                ticks,
            } => match (reported, cpu, dynticks) {
                (false, ..) => write!(
                    f,
                    "tick-free: asked for CPU {} ({asked_by}), but the init did not say where \
                     the loop ran: timer interrupts may be in the counts",
                    asked_cpu.map_or("?".to_string(), |c| c.to_string())
                ),
                (true, Some(cpu), true) => match ticks {
                    Some(0) => write!(
                        f,
                        "tick-free ({asked_by}): the loop ran alone on CPU {cpu}, which the kernel \
                         keeps free of the scheduler tick (nohz_full), and the kernel counted no \
                         local timer interrupt there across the loop: none added CR3 writes to \
                         the calls'; the kernel's context tracking runs at each of its kernel \
                         entries"
                    ),
                    Some(n) => write!(
                        f,
                        "tick-free ({asked_by}): the loop ran alone on CPU {cpu} (nohz_full), but \
                         the kernel counted {n} local timer interrupt(s) there across the loop: \
                         with PTI, up to {} of the CR3 writes are theirs",
                        2 * n
                    ),
                    None => write!(
                        f,
                        "tick-free ({asked_by}): the loop ran alone on CPU {cpu} (nohz_full); the \
                         init did not say how many timer interrupts it took there"
                    ),
                },
                (true, Some(cpu), false) => write!(
                    f,
                    "tick-free ({asked_by}): the loop ran on CPU {cpu}, but the kernel log shows \
                     no full dynticks CPU (a kernel without CONFIG_NO_HZ_FULL ignores \
                     nohz_full=): timer interrupts may be in the counts"
                ),
                (true, None, _) => write!(
                    f,
                    "tick-free ({asked_by}): the init could not pin the loop (its @cpu line is in \
                     the console): timer interrupts may be in the counts"
                ),
            },
            Note::PortMarkers { why, port } => write!(
                f,
                "markers: {} marked the phase through port {port:#x} with ioperm: every return \
                 to user mode of the measured tasks ran the kernel's I/O-bitmap update \
                 (tss_update_io_bitmap), which a process without ioperm does not: it is in every \
                 call's kernel instructions and time (not in KVM's exit, TLB-flush or page-fault \
                 counts)",
                match why {
                    PortMarkerReason::Asked =>
                        "as asked (--append ptiscope.marker=port), the init".to_string(),
                    PortMarkerReason::KvmI386 =>
                        "a 32-bit kernel on KVM: KVM completes an MMIO store by emulating it, and \
                         under --backend nested a PAE guest's marker store never completed, so \
                         the init"
                            .to_string(),
                    PortMarkerReason::MappingRefused { reason } => format!(
                        "the kernel refused the init's /dev/mem mapping of the marker page \
                         ({reason}), so it"
                    ),
                }
            ),
            Note::MeasuredBeforeTimeout {
                after_ms,
                by_symbol,
            } => write!(
                f,
                "--timeout ({} s) stopped the guest after the init's @result line: the figures \
                 are what it measured; its teardown{} did not finish (raise --timeout to let it)",
                *after_ms as f64 / 1e3,
                if *by_symbol {
                    " (sending the kernel's symbols for --by-symbol, whose table may be missing)"
                } else {
                    ""
                }
            ),
            Note::InitNoResult => {
                write!(f, "the init printed no @result line: nothing was measured")
            }
            Note::OuterPluginRows => write!(
                f,
                "[qemu-plugin] rows under --backend nested: the outer QEMU's plugin counted only \
                 what its SVM ran in guest mode (this Linux), none of the inner Linux's or the \
                 VMM's instructions"
            ),
            Note::BySymbolNone { error } => write!(f, "by symbol: none: {error}"),
            Note::OutputDropped {
                output,
                target,
                dropped_bytes,
                dropped_chunks,
                written_bytes,
                queue_kib,
                drain_s,
            } => write!(
                f,
                "{output} {target}: its reader did not keep up: {dropped_bytes} bytes in \
                 {dropped_chunks} writes dropped ({written_bytes} written; queue {queue_kib} KiB, \
                 {drain_s:.1} s to drain after the run)"
            ),
            Note::OutputFailed {
                output,
                target,
                error,
                written_bytes,
                dropped_bytes,
            } => write!(
                f,
                "{output} {target}: write failed: {error} ({written_bytes} bytes written, \
                 {dropped_bytes} dropped)"
            ),
        }
    }
}

/// A note as the run document has it: its code and parameters, and its
/// words.
#[derive(Serialize)]
struct Written<'a> {
    #[serde(flatten)]
    note: &'a Note,
    text: String,
}

/// Serialises notes each with its `text` beside its code (the field's
/// `serialize_with`); reading them back ignores the text.
pub(crate) fn serialize_with_text<S: serde::Serializer>(
    notes: &[Note],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(notes.iter().map(|note| Written {
        note,
        text: note.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A note is its code and parameters with its words, and reads back
    /// (the words ignored) as it was.
    #[test]
    fn a_note_is_its_code_and_parameters_with_its_words() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Doc {
            #[serde(serialize_with = "serialize_with_text")]
            notes: Vec<Note>,
        }
        let doc = Doc {
            notes: vec![
                Note::KvmStatsUnavailable {
                    error: "EPERM".into(),
                },
                Note::NoPhase,
                Note::Pti {
                    enabled: true,
                    host_check: PtiHostCheck::Agrees {
                        source: "kvm".into(),
                        cr3_per_syscall: 2.0,
                    },
                },
            ],
        };
        let v = serde_json::to_value(&doc).unwrap();
        assert_eq!(
            v["notes"][0],
            json!({"code": "kvm_stats_unavailable", "error": "EPERM",
                   "text": "KVM stats fd not available: EPERM"})
        );
        assert_eq!(v["notes"][1]["code"], "no_phase");
        assert_eq!(v["notes"][2]["host_check"]["kind"], "agrees");
        assert!(
            v["notes"][2]["text"]
                .as_str()
                .unwrap()
                .ends_with("the host (kvm) agrees: 2.00 CR3 writes per system call"),
            "{v}"
        );
        assert_eq!(serde_json::from_value::<Doc>(v).unwrap(), doc);
    }

    /// An output's note says what became of it, from its report's fields.
    #[test]
    fn an_output_that_dropped_or_failed_gets_its_note() {
        let mut o = crate::output::OutputReport {
            what: "--metrics-out".into(),
            target: "f".into(),
            written_bytes: 10,
            dropped_bytes: 5,
            dropped_chunks: 1,
            ..Default::default()
        };
        let n = Note::of_output(&o).unwrap();
        assert!(
            matches!(
                n,
                Note::OutputDropped {
                    dropped_bytes: 5,
                    ..
                }
            ),
            "{n:?}"
        );
        assert!(n.to_string().contains("its reader did not keep up"), "{n}");
        o.error = Some("No space left on device".into());
        assert!(matches!(
            Note::of_output(&o),
            Some(Note::OutputFailed { .. })
        ));
        o.error = None;
        o.dropped_bytes = 0;
        assert_eq!(Note::of_output(&o), None);
    }
}
