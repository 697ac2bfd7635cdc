//! Reader for KVM's binary statistics file descriptors (KVM_GET_STATS_FD).
