//! The swap file encrypted (`encrypt`): a [`SwapIo`] wrapper that seals every 4 KiB
//! page on its way to the file and opens it on its way back (`seal.rs`).
//!
//! A slot holds exactly 4 KiB on disk, so the page's write number and tag stay in memory,
//! in two tables beside the file (24 bytes per slot, touched only as slots are written):
//! the file alone is ciphertext nobody can read or alter unnoticed, and it means nothing
//! once the process is gone. A page that fails to open fails the read (EBADMSG): the
//! fault that wanted it gets SIGBUS, never altered data.

use super::io::{AlignedBuf, SwapIo, SwapIoStats};
use super::zeroed_u64s;
use crate::seal::{Sealer, TAG_LEN};
use crate::size::PAGE_SIZE;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct SealedIo {
    inner: Box<dyn SwapIo>,
    sealer: Sealer,
    /// Per slot: the write number its page was sealed under (0: never written).
    writes: Box<[AtomicU64]>,
    /// Per slot: the page's tag, as two words.
    tags_lo: Box<[AtomicU64]>,
    tags_hi: Box<[AtomicU64]>,
}

impl SealedIo {
    pub fn new(inner: Box<dyn SwapIo>) -> io::Result<SealedIo> {
        let slots = inner.slots() as usize;
        Ok(SealedIo { sealer: Sealer::new()?, writes: zeroed_u64s(slots), tags_lo: zeroed_u64s(slots), tags_hi: zeroed_u64s(slots), inner })
    }

    /// Seal `data` (whole pages for the slots from `slot`) into a new buffer.
    fn seal(&self, slot: u64, data: &[u8]) -> AlignedBuf {
        let mut out = AlignedBuf::zeroed(data.len());
        out.copy_from_slice(data);
        for (i, page) in out.chunks_mut(PAGE_SIZE).enumerate() {
            let at = slot + i as u64;
            let write = self.sealer.next_write();
            let tag = self.sealer.seal(write, 0, &at.to_le_bytes(), page);
            self.writes[at as usize].store(write, Ordering::Relaxed);
            let (lo, hi) = (&self.tags_lo[at as usize], &self.tags_hi[at as usize]);
            lo.store(u64::from_le_bytes(tag[..8].try_into().unwrap()), Ordering::Relaxed);
            hi.store(u64::from_le_bytes(tag[8..].try_into().unwrap()), Ordering::Relaxed);
        }
        out
    }

    /// Open the pages read into `dst` for the slots from `slot`.
    fn open(&self, slot: u64, dst: &mut [u8]) -> io::Result<()> {
        for (i, page) in dst.chunks_mut(PAGE_SIZE).enumerate() {
            let at = slot + i as u64;
            let write = self.writes[at as usize].load(Ordering::Relaxed);
            let (lo, hi) = (&self.tags_lo[at as usize], &self.tags_hi[at as usize]);
            let mut tag = [0u8; TAG_LEN];
            tag[..8].copy_from_slice(&lo.load(Ordering::Relaxed).to_le_bytes());
            tag[8..].copy_from_slice(&hi.load(Ordering::Relaxed).to_le_bytes());
            if write == 0 || self.sealer.open(write, 0, &at.to_le_bytes(), page, &tag).is_err() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("swap slot {at} fails authentication: the encrypted page on the file is not the one written there"),
                ));
            }
        }
        Ok(())
    }
}

impl SwapIo for SealedIo {
    fn write_at(&self, slot: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write_at(slot, &self.seal(slot, data))
    }
    fn write_batch(&self, ios: &[(u64, &[u8])]) -> io::Result<()> {
        let sealed: Vec<(u64, AlignedBuf)> = ios.iter().map(|&(slot, data)| (slot, self.seal(slot, data))).collect();
        let refs: Vec<(u64, &[u8])> = sealed.iter().map(|(slot, buf)| (*slot, &buf[..])).collect();
        self.inner.write_batch(&refs)
    }
    fn read_at(&self, slot: u64, dst: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(slot, dst)?;
        self.open(slot, dst)
    }
    fn read_batch(&self, ios: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        self.inner.read_batch(ios)?;
        ios.iter_mut().try_for_each(|(slot, dst)| self.open(*slot, dst))
    }
    fn slots(&self) -> u64 {
        self.inner.slots()
    }
    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
    fn stats(&self) -> SwapIoStats {
        SwapIoStats { encrypted: true, ..self.inner.stats() }
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.raw_fd()
    }
    fn location(&self) -> Option<&Path> {
        self.inner.location()
    }
    fn disk_bytes(&self) -> Option<u64> {
        self.inner.disk_bytes()
    }
    fn discard(&self, slot: u64, pages: u64) {
        self.inner.discard(slot, pages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swapfile::io::SwapFile;

    #[test]
    fn pages_go_out_sealed_and_come_back_checked() {
        let dir = std::env::temp_dir();
        let file = SwapFile::create_sparse(&dir, 4 << 20).expect("a sparse swap file in the temp dir");
        let fd = file.raw_fd().unwrap();
        let io = SealedIo::new(Box::new(file)).unwrap();
        let data: Vec<u8> = (0..4 * PAGE_SIZE).map(|i| (i % 251) as u8).collect();
        io.write_at(8, &data).unwrap();
        // What is on the file is not the data.
        let mut raw = AlignedBuf::zeroed(data.len());
        // SAFETY: reads into a live, aligned buffer of exactly that length from our own descriptor.
        let n = unsafe { libc::pread(fd, raw.as_mut_ptr().cast(), raw.len(), 8 * PAGE_SIZE as i64) };
        assert_eq!(n as usize, raw.len());
        assert!(raw.chunks(PAGE_SIZE).zip(data.chunks(PAGE_SIZE)).all(|(r, d)| r != d));
        // Whole, and in part.
        let mut back = vec![0u8; data.len()];
        io.read_at(8, &mut back).unwrap();
        assert_eq!(back, data);
        let mut one = vec![0u8; PAGE_SIZE];
        io.read_at(10, &mut one).unwrap();
        assert_eq!(one, data[2 * PAGE_SIZE..3 * PAGE_SIZE]);
        // A page altered on the file, or moved to another slot, fails to open.
        raw[PAGE_SIZE + 5] ^= 0x40;
        // SAFETY: writes a live, aligned buffer of exactly that length through our own descriptor.
        let n = unsafe { libc::pwrite(fd, raw.as_ptr().cast(), raw.len(), 8 * PAGE_SIZE as i64) };
        assert_eq!(n as usize, raw.len());
        let err = io.read_at(8, &mut back).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("slot 9"), "{err}");
        // SAFETY: as above, one page at another slot.
        let n = unsafe { libc::pwrite(fd, raw.as_ptr().cast(), PAGE_SIZE, 20 * PAGE_SIZE as i64) };
        assert_eq!(n as usize, PAGE_SIZE);
        assert!(io.read_at(20, &mut one).is_err(), "a page never written there");
    }
}
