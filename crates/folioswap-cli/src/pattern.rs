//! The data the benchmarks write and verify.
//!
//! Word `j` written in round `r` by worker `t` holds `value(t, j, r)`: the index mixed with
//! the round and the worker, so a stale round, a misplaced folio or another worker's data
//! all read back wrong. Like usemem's own `p[idx] = idx`, lz4 halves it.
//!
//! Random order uses a bijection of the word indices (multiply, xorshift, add, three
//! rounds, on the next power of two, cycle-walked into range), so a random pass writes
//! every word once before any twice, and the inverse tells which write of a word came last.

pub fn value(worker: u64, word: u64, round: u64) -> u64 {
    word ^ ((round + 1) << 40) ^ (worker << 52)
}

/// A pseudo-random permutation of `0..n`.
pub struct Permutation {
    n: u64,
    bits: u32,
    mask: u64,
    keys: [(u64, u64, u64); 3],
}

fn mul_inverse(a: u64) -> u64 {
    // Newton's iteration for the inverse of an odd number modulo 2^64.
    let mut x = a;
    for _ in 0..6 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
    }
    x
}

impl Permutation {
    pub fn new(n: u64, seed: u64) -> Permutation {
        assert!(n > 0);
        let bits = (64 - (n - 1).leading_zeros()).max(2);
        let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let keys = [(next() | 1, next(), 0), (next() | 1, next(), 0), (next() | 1, next(), 0)].map(|(m, a, _)| (m, a, mul_inverse(m)));
        Permutation { n, bits, mask, keys }
    }

    fn shift(&self) -> u32 {
        self.bits / 2 + 1
    }

    fn forward_once(&self, mut x: u64) -> u64 {
        let s = self.shift();
        for &(m, a, _) in &self.keys {
            x = x.wrapping_mul(m) & self.mask;
            x ^= x >> s;
            x = x.wrapping_add(a) & self.mask;
        }
        x
    }

    fn inverse_once(&self, mut x: u64) -> u64 {
        let s = self.shift();
        for &(_, a, inv) in self.keys.iter().rev() {
            // Undo the add, then the xorshift (x = y ^ (x >> s) has one fixed point:
            // the original), then the multiply.
            let y = x.wrapping_sub(a) & self.mask;
            x = y;
            let mut k = 0;
            while k < self.bits {
                x = y ^ (x >> s);
                k += s;
            }
            x = x.wrapping_mul(inv) & self.mask;
        }
        x
    }

    pub fn apply(&self, i: u64) -> u64 {
        let mut x = self.forward_once(i);
        while x >= self.n {
            x = self.forward_once(x);
        }
        x
    }

    pub fn invert(&self, j: u64) -> u64 {
        let mut x = self.inverse_once(j);
        while x >= self.n {
            x = self.inverse_once(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_permutation_with_an_inverse() {
        for n in [1u64, 2, 3, 7, 1000, 4096, 65537] {
            let p = Permutation::new(n, n * 31);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i);
                assert!(j < n);
                assert!(!seen[j as usize], "n={n}: {j} twice");
                seen[j as usize] = true;
                assert_eq!(p.invert(j), i);
            }
        }
    }

    #[test]
    fn scatters_neighbours() {
        let p = Permutation::new(1 << 20, 1);
        let far = (0..1000u64).filter(|&i| p.apply(i).abs_diff(p.apply(i + 1)) > 512).count();
        assert!(far > 950, "{far}");
    }
}
