//! The kernel-image checks and loaders (ELF64 through linux-loader after our
//! own header checks, ELF32 through `object`): any bytes as `--kernel`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptiscope::machine::loader;
use ptiscope::machine::memory::MemoryLayout;

fuzz_target!(|image: &[u8]| {
    // 16 MiB: the smallest layout, so segments often fall outside RAM too.
    let layout = MemoryLayout::new(16).expect("16 MiB is a valid layout");
    let checked = loader::check_image(image, "fuzz", &layout);
    let mem = layout
        .create_guest_memory()
        .expect("16 MiB of guest memory");
    let loaded = loader::load_bytes(&mem, &layout, "fuzz", image);
    // What passes the check must load, at an entry inside what it loaded.
    if checked.is_ok() {
        let k = loaded.expect("an image that passed check_image failed to load");
        assert!(
            k.entry < k.end,
            "entry {:#x} past the end {:#x}",
            k.entry,
            k.end
        );
    }
    let _ = loader::is_elf32(image);
});
