//! Other ways to run the same guest image: QEMU (TCG or KVM) for what the
//! host's KVM cannot run, with every figure marked guest-reported.

pub mod qemu;
