//! Host-side reader of the guest telemetry region (layout: ptiscope-abi, docs/telemetry-abi.md).
