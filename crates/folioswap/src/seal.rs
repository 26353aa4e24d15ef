//! Authenticated encryption of 4 KiB pages that leave the process: the remote tier's
//! values (`remote.rs`) and, with `encrypt`, the swap file (`swapfile/sealed.rs`).
//!
//! ChaCha20-Poly1305 with a 256-bit key drawn from the kernel's random source when the
//! engine starts; the key lives only in this process's memory and dies with it, so what
//! was written is unreadable to anyone else, and to the next run. Each page is sealed on
//! its own (ciphertext of the same length, plus a 16-byte tag), so a part of a folio can
//! be read back and checked without the rest.
//!
//! Nonces never repeat under one key: a nonce is a 64-bit write number, unique per write
//! (`Sealer::next_write`), and the page's index within that write. Whoever stores the
//! page keeps the write number (and, where the medium has no room for it, the tag); the
//! associated data binds the page to the place it was written for, so a page read from
//! the wrong place, or an older write at the same place, fails to open.

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{ChaCha20Poly1305, Key, KeyInit, Nonce, Tag};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of a tag.
pub(crate) const TAG_LEN: usize = 16;

pub(crate) struct Sealer {
    cipher: ChaCha20Poly1305,
    writes: AtomicU64,
}

/// A page failed to open: it is not what was sealed for that place and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unauthentic;

impl Sealer {
    /// A sealer with a fresh random key.
    pub fn new() -> std::io::Result<Sealer> {
        let mut key = [0u8; 32];
        fill_random(&mut key)?;
        let sealer = Sealer { cipher: ChaCha20Poly1305::new(&Key::from(key)), writes: AtomicU64::new(1) };
        key.fill(0);
        Ok(sealer)
    }

    /// A number no other write under this key has had.
    pub fn next_write(&self) -> u64 {
        self.writes.fetch_add(1, Ordering::Relaxed)
    }

    fn nonce(write: u64, page: u32) -> Nonce {
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&write.to_le_bytes());
        n[8..].copy_from_slice(&page.to_le_bytes());
        Nonce::from(n)
    }

    /// Encrypt `data` in place as page `page` of write `write`, bound to `place`.
    pub fn seal(&self, write: u64, page: u32, place: &[u8], data: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self
            .cipher
            .encrypt_inout_detached(&Self::nonce(write, page), place, data.into())
            .expect("ChaCha20-Poly1305 seals any page-sized buffer");
        tag.into()
    }

    /// Decrypt `data` in place if `tag` proves it is page `page` of write `write` for
    /// `place`; otherwise `data` is left undefined.
    pub fn open(&self, write: u64, page: u32, place: &[u8], data: &mut [u8], tag: &[u8; TAG_LEN]) -> Result<(), Unauthentic> {
        self.cipher.decrypt_inout_detached(&Self::nonce(write, page), place, data.into(), &Tag::from(*tag)).map_err(|_| Unauthentic)
    }
}

/// Fill `buf` from the kernel's random source (getrandom(2), blocking until it is seeded).
fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most `buf.len() - done` bytes into the live slice from `done`.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_opens_only_where_and_as_it_was_sealed() {
        let s = Sealer::new().unwrap();
        let plain: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let mut page = plain.clone();
        let w = s.next_write();
        let tag = s.seal(w, 3, b"slot 9", &mut page);
        assert_ne!(page, plain, "sealed data is not the plaintext");
        let sealed = page.clone();
        s.open(w, 3, b"slot 9", &mut page, &tag).unwrap();
        assert_eq!(page, plain);
        for (write, index, place) in [(w + 1, 3, &b"slot 9"[..]), (w, 4, b"slot 9"), (w, 3, b"slot 8")] {
            let mut p = sealed.clone();
            assert_eq!(s.open(write, index, place, &mut p, &tag), Err(Unauthentic));
        }
        let mut flipped = sealed.clone();
        flipped[100] ^= 1;
        assert_eq!(s.open(w, 3, b"slot 9", &mut flipped, &tag), Err(Unauthentic));
        let other = Sealer::new().unwrap();
        let mut p = sealed.clone();
        assert_eq!(other.open(w, 3, b"slot 9", &mut p, &tag), Err(Unauthentic), "another engine's key");
    }
}
