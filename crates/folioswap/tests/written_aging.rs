//! Written bits (`written.rs`, `FOLIOSWAP_WRITTEN_AGING`, off by default): regions under
//! 2 MiB folios registered async write-protect, their written bits harvested by eviction
//! and read at the inactive head. These tests check that every word holds while a hot set
//! is rewritten beside a stream (the bits read and cleared all the while, pages moved in
//! and out under protection), and that the knob says why it cannot work in copy mode.
//! Forking with it on is in `fork.rs`.

mod common;

use common::{check, fill};
use folioswap::{Config, Engine, FaultMode, FolioSize, RegionOptions};

const MIB: usize = 1 << 20;

/// Under a 16M limit one thread rewrites a 6M hot set of 64 KiB folios with a new version
/// each pass and checks it, while another streams through 24M of 4 KiB folios: written
/// pages are sent round the LRU, the stream's are evicted, and both are read back whole.
#[test]
fn a_hot_set_rewritten_beside_a_stream_keeps_every_word() {
    hot_set_beside_stream(FaultMode::Thread);
}

/// The same with the faulting threads serving their own faults: a write-protect fault is
/// the kernel's alone, and must not reach the SIGBUS handler.
#[test]
fn a_hot_set_rewritten_beside_a_stream_keeps_every_word_in_signal_mode() {
    hot_set_beside_stream(FaultMode::Signal);
}

fn hot_set_beside_stream(mode: FaultMode) {
    let engine = Engine::new(Config::default().written_aging(true).fault_mode(mode).memory_high("16M").unwrap()).unwrap_or_else(|e| {
        panic!("cannot start the engine (written_aging needs async write-protect, Linux 6.7+, and UFFDIO_MOVE, 6.8+): {e}")
    });
    let mut hot = engine.map(6 * MIB, RegionOptions::default().folio(FolioSize::K64)).unwrap();
    let mut stream = engine.map(24 * MIB, RegionOptions::default().folio(FolioSize::K4)).unwrap();
    let streamer = std::thread::spawn(move || {
        for pass in 1..=4 {
            fill(&mut stream, pass);
            check(&stream, pass);
        }
        stream
    });
    for pass in 1..=8 {
        fill(&mut hot, 100 + pass);
        check(&hot, 100 + pass);
    }
    let stream = streamer.join().expect("the streaming thread failed");
    check(&stream, 4);
    check(&hot, 108);
    let vm = engine.stats().vm;
    assert!(vm.zswpout + vm.pswpout > 0, "nothing was swapped out: the test does not test: {vm:?}");
    assert!(vm.written_harvest > 0, "eviction never harvested the written bits: {vm:?}");
    assert!(vm.pgrotated > 0, "no written folio was sent round the inactive list: {vm:?}");
}

#[test]
fn written_aging_in_copy_mode_is_refused_with_the_reason() {
    let err = Engine::new(Config::default().uffd_move(false).written_aging(true)).err().expect("copy mode cannot read written bits");
    let text = err.to_string();
    assert!(text.contains("FOLIOSWAP_WRITTEN_AGING") && text.contains("move mode"), "{text}");
}
