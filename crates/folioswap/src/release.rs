//! Letting go of what a folio holds: its charge, its staged copy, its stored data.
//! Called under the folio's lock by every path that discards a folio or finishes with a
//! copy (faults, evictions, events, region drops).

use crate::folio::Kind;
use crate::install::Installed;
use crate::memcg::Component;
use crate::mm::Mm;
use crate::size::FolioSize;
use crate::staging::{Slot, Staged};

/// Release whatever a folio holds (its storage and its charge), leaving its kind to the
/// caller. `writeback`: the folio is SwapCache under WRITEBACK.
pub(crate) fn drop_storage(mm: &Mm, kind: Kind, handle: u64, folio: FolioSize, writeback: bool) {
    let bytes = folio.bytes() as u64;
    match kind {
        Kind::Resident => mm.memcg.uncharge(Component::Resident, bytes),
        // Under writeback the compressor owns the slot and its charge: it sees the
        // folio changed and releases both when it finishes.
        Kind::SwapCache if writeback => {}
        Kind::SwapCache => release_staged(mm, Staged::from_raw(handle), folio, false),
        Kind::Pool | Kind::Swapped => mm.tiers.free(kind, handle, folio),
        Kind::Untouched | Kind::ZeroSwapped | Kind::Gone => {}
    }
}

/// The swap cache lets go of a folio's staged copy (stored, discarded, or copied back):
/// a 2 MiB folio's slot is kept filled for reuse or emptied; a batch member's share of
/// its batch slot stays charged until the batch's last member lets go.
pub(crate) fn release_staged(mm: &Mm, at: Staged, folio: FolioSize, huge: bool) {
    let bytes = folio.bytes() as u64;
    if folio.is_huge() {
        mm.memcg.uncharge(Component::SwapCache, bytes);
        mm.staging.put_filled(at.slot, huge, &mm.memcg);
    } else {
        mm.memcg.transfer(Component::SwapCache, Component::StagingFree, bytes);
        mm.staging.end_batch_member(at.slot, bytes, &mm.memcg);
    }
}

/// Give a slot back after its folio was installed from it: a hole if its pages moved
/// into the region, still filled (for the next swap-in) if they were copied.
pub(crate) fn release_after_install(mm: &Mm, slot: Slot, how: Installed, huge: bool) {
    match how {
        Installed::Moved => mm.staging.put_hole(slot),
        Installed::Copied | Installed::Collapsed => mm.staging.put_filled(slot, huge, &mm.memcg),
    }
}
