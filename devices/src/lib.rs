//! Device models on the ptiscope VMM's PIO bus.
