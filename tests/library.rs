//! `run_vm` as a library: phase markers reach the observer synchronously,
//! invalid markers are counted, and several VMs run one after another in one
//! process (as `compare` does).

mod common;

use ptiscope::machine::loader::KernelSource;
use ptiscope::machine::VmContext;
use ptiscope::SerialOut;
use ptiscope::{run_vm, HostFacts, PhaseObserver, RunConfig, StopReason};
use ptiscope_abi::phase::Marker;

#[derive(Default)]
struct Recorder {
    started: bool,
    markers: Vec<(Marker, u64)>,
    stopped: bool,
}

impl PhaseObserver for Recorder {
    fn on_start(&mut self, _ctx: &VmContext<'_>) {
        self.started = true;
    }
    fn on_phase(&mut self, marker: Marker, ctx: &VmContext<'_>) {
        // The observer runs at the exit itself: the phase-port write that
        // carried this marker is already counted.
        self.markers.push((marker, ctx.exits.io_out.phase));
    }
    fn on_stop(&mut self, _ctx: &VmContext<'_>) {
        self.stopped = true;
    }
}

#[test]
fn phase_markers_reach_the_observer_and_vms_can_be_run_repeatedly() {
    if !common::kvm_or_skip("library phase markers") {
        return;
    }
    // mov dx, 0x600
    // mov eax, 1;          out dx, eax   (begin 1)
    // mov eax, 0x00100000; out dx, eax   (reserved bit: invalid)
    // mov eax, 0x80000001; out dx, eax   (end 1)
    // xor eax, eax; out 0xf4, eax; hlt
    let code = [
        0x66, 0xba, 0x00, 0x06, //
        0xb8, 0x01, 0x00, 0x00, 0x00, 0xef, //
        0xb8, 0x00, 0x00, 0x10, 0x00, 0xef, //
        0xb8, 0x01, 0x00, 0x00, 0x80, 0xef, //
        0x31, 0xc0, 0xe7, 0xf4, 0xf4,
    ];
    let elf = common::scratch("library").join("phases.elf");
    common::write_pvh_elf(&elf, 0x100000, &code);
    let mut config = RunConfig::new(KernelSource::Path(elf));
    config.serial_out = SerialOut::Discard;
    config.mem_mib = 16;

    // One set of host facts for every round, as a process gathers them once.
    let facts = HostFacts::read();
    for round in 0..3 {
        let mut obs = Recorder::default();
        let out =
            run_vm(&config, &facts, &mut obs).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(
            out.stop,
            StopReason::GuestExit { status: 0 },
            "round {round}"
        );
        assert!(obs.started && obs.stopped);
        assert_eq!(
            obs.markers,
            vec![(Marker::begin(1), 1), (Marker::end(1), 3)],
            "round {round}"
        );
        assert_eq!(out.exits.invalid_phase_markers, 1);
        assert_eq!(out.phases.len(), 2);
        assert!(out.phases[0].at_ns <= out.phases[1].at_ns);
        assert!(out
            .cmdline
            .ends_with(&format!("telemetry={:#x}", 16 * 1024 * 1024 - 4096)));
    }
}
