//! Helpers shared by the integration tests: a verifiable fill pattern.
#![allow(dead_code)] // each test binary uses its own subset of these helpers

use folioswap::Region;

/// The word `fill(region, seed)` writes at index `j`: the index mixed with the seed.
pub fn word(j: usize, seed: u64) -> u64 {
    j as u64 ^ (seed << 40)
}

/// Write every word of `region` as its index mixed with `seed`.
pub fn fill(region: &mut Region, seed: u64) {
    for (j, w) in region.as_mut_slice().chunks_mut(8).enumerate() {
        w.copy_from_slice(&word(j, seed).to_le_bytes());
    }
}

/// Write the 4 KiB page `page` of `region` as `fill(region, seed)` would.
pub fn fill_page(region: &mut Region, page: usize, seed: u64) {
    let words = 4096 / 8;
    let bytes = &mut region.as_mut_slice()[page * 4096..(page + 1) * 4096];
    for (k, w) in bytes.chunks_mut(8).enumerate() {
        w.copy_from_slice(&word(page * words + k, seed).to_le_bytes());
    }
}

/// Check every word `fill(region, seed)` wrote.
pub fn check(region: &Region, seed: u64) {
    for (j, w) in region.as_slice().chunks(8).enumerate() {
        let got = u64::from_le_bytes(w.try_into().unwrap());
        assert_eq!(got, word(j, seed), "word {j} of a {} region", region.folio_size());
    }
}

/// Fill `region` with incompressible words (xorshift), which no pool can shrink.
pub fn fill_incompressible(region: &mut Region) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for w in region.as_mut_slice().chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
}

/// Check every word `fill_incompressible` wrote, regenerating the sequence as it goes
/// (no second copy is held).
pub fn check_incompressible(region: &Region) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for (j, w) in region.as_slice().chunks(8).enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), x, "word {j} of a {} region", region.folio_size());
    }
}

/// splitmix64's finalizer: a well-mixed 64-bit hash of `x` (data no codec shrinks).
pub fn mix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The byte `fill_text(region, seed)` writes at offset `i`: a letter or digit, drawn by a
/// hash of the offset and the seed. Such text is what lz4 cannot shrink (it has no
/// entropy coder, and random letters repeat no 4-byte string) while zstd takes a third off.
pub fn text_byte(i: usize, seed: u64) -> u8 {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let z = mix64((i as u64).wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    ALPHABET[(z % ALPHABET.len() as u64) as usize]
}

/// Fill `region` with random letters and digits (`text_byte`).
pub fn fill_text(region: &mut Region, seed: u64) {
    for (i, b) in region.as_mut_slice().iter_mut().enumerate() {
        *b = text_byte(i, seed);
    }
}

/// Check every byte `fill_text(region, seed)` wrote.
pub fn check_text(region: &Region, seed: u64) {
    for (i, &b) in region.as_slice().iter().enumerate() {
        assert_eq!(b, text_byte(i, seed), "byte {i} of a {} region", region.folio_size());
    }
}

/// Run the ignored test `name` of this test binary in a child process that must die of
/// SIGBUS; returns its stderr.
pub fn run_child_expecting_sigbus(name: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"])
        .env("FOLIOSWAP_TEST_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{name} should die of SIGBUS: {:?}\n{stderr}", out.status);
    stderr
}

/// The user tests drop to: nobody.
pub const NOBODY: u32 = 65534;

/// Whether a process of an ordinary user gets a full userfaultfd here anyway
/// (`vm.unprivileged_userfaultfd=1`, or a world-accessible /dev/userfaultfd); otherwise
/// it gets a user-mode-only one.
pub fn unprivileged_full_userfaultfd() -> bool {
    use std::os::unix::fs::PermissionsExt;
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").map(|v| v.trim() == "1").unwrap_or(false);
    let dev = std::fs::metadata("/dev/userfaultfd").map(|m| m.permissions().mode() & 0o006 == 0o006).unwrap_or(false);
    sysctl || dev
}

/// Run `f` in a forked child process as user nobody and wait for it; a panic in the child
/// fails the caller with the child's panic message. The caller must be root and should
/// hold a lock that keeps the other tests of its binary from running meanwhile (a fork
/// copies only the calling thread, and locks other threads hold stay held in the child).
///
/// The child drops its groups, gid and uid, then marks itself dumpable again: a process
/// that changed its credentials becomes undumpable, which makes its own /proc/self files
/// root's, and the engine reads /proc/self/pagemap.
pub fn as_nobody(f: impl FnOnce()) {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root, to drop to user nobody");
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2: {}", std::io::Error::last_os_error());
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: the child runs `f` and leaves with _exit, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let report = move |text: &str| {
            // SAFETY: write(2) of a live buffer to the pipe this child owns.
            unsafe { libc::write(wr, text.as_ptr().cast(), text.len()) };
        };
        std::panic::set_hook(Box::new(move |info| report(&info.to_string())));
        // SAFETY: credential changes of this (single-threaded) child only; results checked.
        let dropped = unsafe {
            libc::setgroups(0, std::ptr::null()) == 0
                && libc::setgid(NOBODY) == 0
                && libc::setuid(NOBODY) == 0
                && libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) == 0
        };
        let ok = dropped && std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok();
        if !dropped {
            report(&format!("cannot become user nobody: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: ends the child at once, running no destructor of the parent's state.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    // SAFETY: `wr` is ours and not needed in the parent; `rd` becomes a File that closes it.
    let mut pipe = unsafe {
        libc::close(wr);
        std::fs::File::from_raw_fd(rd)
    };
    let mut message = String::new();
    let _ = pipe.read_to_string(&mut message);
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child running as nobody failed (status {status:#x}): {message}"
    );
}

/// In a forked child: run `f`, then leave at once with its verdict (0 or 1), running no
/// destructor of the parent's state.
pub fn in_child(f: impl FnOnce()) -> ! {
    let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(()) => 0,
        Err(_) => 1,
    };
    // SAFETY: _exit ends the child without unwinding or running atexit handlers.
    unsafe { libc::_exit(code) }
}

/// Wait for `pid`, which must exit normally; returns its exit code.
pub fn wait_child(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(libc::WIFEXITED(status), "the child died (status {status:#x})");
    libc::WEXITSTATUS(status)
}

/// The byte a sentinel mapping is filled with.
pub const SENTINEL: u8 = 0x5A;

/// Map `len` bytes at `addr` with MAP_FIXED_NOREPLACE (never over another mapping) and
/// fill them with [`SENTINEL`]; the mmap error (EEXIST while something is still mapped
/// there) otherwise. Unmapped with `munmap` by the caller.
pub fn map_sentinel(addr: usize, len: usize) -> Result<(), std::io::Error> {
    // SAFETY: a fresh private anonymous mapping; MAP_FIXED_NOREPLACE fails rather than
    // replace anything mapped at `addr`.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    assert_eq!(p as usize, addr, "MAP_FIXED_NOREPLACE mapped elsewhere (a kernel before 4.17?)");
    // SAFETY: the mapping just made, `len` bytes, referenced by nothing else.
    unsafe { std::ptr::write_bytes(p as *mut u8, SENTINEL, len) };
    Ok(())
}

/// Whether the sentinel mapping at `at` still holds [`SENTINEL`] in every byte.
pub fn sentinel_intact(at: usize, len: usize) -> bool {
    // SAFETY: the caller's sentinel mapping, still mapped.
    let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
    bytes.iter().all(|&b| b == SENTINEL)
}

/// Check every word of `region` written by `fill(region, seed)` outside the hole
/// `[at, at + len)` the test unmapped.
pub fn check_outside_hole(region: &Region, at: usize, len: usize, seed: u64) {
    let start = region.as_ptr() as usize;
    let hole = (at - start) / 8..(at - start + len) / 8;
    for (j, w) in region.as_slice().chunks(8).enumerate() {
        if !hole.contains(&j) {
            assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), word(j, seed), "word {j}");
        }
    }
}
