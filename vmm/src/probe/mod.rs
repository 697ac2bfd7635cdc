//! `ptiscope probe`: what this host's KVM can run, found by booting tiny probe guests.
