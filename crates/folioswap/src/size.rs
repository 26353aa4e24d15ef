//! Sizes as people write them: folio sizes (`4K` … `2M`), byte counts (`512M`, `4G`) and
//! pool limits (`256M` or `20%` of physical memory, as zswap's `max_pool_percent`).
//!
//! Suffixes are binary (K = 1024), case-insensitive, and may carry `B`, `iB`: `64K`, `64k`,
//! `64KB`, `64KiB` and `65536` are the same size.

use std::fmt;
use std::str::FromStr;

pub const PAGE_SIZE: usize = 4096;
pub const PAGE_SHIFT: u32 = 12;
/// The PMD size on x86-64: the one folio size the kernel maps as a huge page.
pub const HUGE_SIZE: usize = 2 << 20;

/// A size string that could not be parsed, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeError {
    pub input: String,
    pub reason: String,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for SizeError {}

fn size_error(input: &str, reason: impl Into<String>) -> SizeError {
    SizeError { input: input.to_string(), reason: reason.into() }
}

/// Parse a byte count: digits with an optional fraction and an optional binary suffix
/// (`K`, `M`, `G`, `T`, each optionally followed by `B` or `iB`; a bare `B` means bytes).
pub fn parse_bytes(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() || number.chars().filter(|&c| c == '.').count() > 1 || number.ends_with('.') {
        return Err(size_error(input, "expected a number with an optional K/M/G/T suffix, like 512M"));
    }
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(size_error(input, "unknown suffix; use K, M, G or T (powers of 1024)")),
    };
    let too_big = || size_error(input, "too large");
    match number.split_once('.') {
        None => {
            let n: u64 = number.parse().map_err(|_| too_big())?;
            n.checked_mul(1u64 << shift).ok_or_else(too_big)
        }
        Some((whole, frac)) => {
            // `.5M`: no whole part. Too many digits must not read as none at all.
            let whole: u64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| too_big())? };
            let frac_digits = frac.len().min(9) as u32;
            let frac_val: u64 = frac[..frac_digits as usize].parse().map_err(|_| too_big())?;
            let unit = 1u128 << shift;
            let bytes = whole as u128 * unit + frac_val as u128 * unit / 10u128.pow(frac_digits);
            u64::try_from(bytes).map_err(|_| too_big())
        }
    }
}

/// Format a byte count the way [`parse_bytes`] reads it back, exactly when possible; else
/// to a tenth of the largest unit it reaches (`1.5G`), rounded half to even, and never up
/// past what a `u64` holds (so that the text always parses).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "T"), (30, "G"), (20, "M"), (10, "K")];
    for (shift, suffix) in UNITS {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{}", bytes >> shift, suffix);
        }
    }
    for (shift, suffix) in UNITS {
        if bytes >= 1 << shift {
            let unit = 1u128 << shift;
            let scaled = bytes as u128 * 10;
            let (mut tenths, rest) = (scaled / unit, scaled % unit);
            let up = 2 * rest > unit || (2 * rest == unit && tenths % 2 == 1);
            // parse_bytes reads `W.F` back as W units plus F tenths of one, rounded down.
            if up && (tenths + 1) * unit / 10 <= u64::MAX as u128 {
                tenths += 1;
            }
            return format!("{}.{}{}", tenths / 10, tenths % 10, suffix);
        }
    }
    format!("{bytes}B")
}

/// A byte count as [`format_bytes`] writes it when that is exact, else in plain digits:
/// text that [`parse_bytes`] reads back as exactly `bytes`.
pub(crate) fn format_bytes_exact(bytes: u64) -> String {
    let text = format_bytes(bytes);
    if text.contains('.') {
        bytes.to_string()
    } else {
        text
    }
}

/// One of the ten folio sizes the engine swaps as a unit: 4 KiB << order, order 0..=9.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FolioSize {
    order: u8,
}

impl FolioSize {
    pub const MAX_ORDER: u32 = 9;
    pub const K4: FolioSize = FolioSize { order: 0 };
    pub const K64: FolioSize = FolioSize { order: 4 };
    pub const M2: FolioSize = FolioSize { order: 9 };
    pub const ALL: [FolioSize; 10] = {
        let mut all = [FolioSize { order: 0 }; 10];
        let mut i = 0;
        while i < 10 {
            all[i] = FolioSize { order: i as u8 };
            i += 1;
        }
        all
    };
    pub const ACCEPTED: &'static str = "4K, 8K, 16K, 32K, 64K, 128K, 256K, 512K, 1M or 2M";

    pub const fn from_order(order: u32) -> Option<FolioSize> {
        if order <= Self::MAX_ORDER {
            Some(FolioSize { order: order as u8 })
        } else {
            None
        }
    }

    pub fn from_bytes(bytes: u64) -> Option<FolioSize> {
        if bytes < PAGE_SIZE as u64 || !bytes.is_power_of_two() {
            return None;
        }
        Self::from_order(bytes.trailing_zeros() - PAGE_SHIFT)
    }

    pub const fn order(self) -> u32 {
        self.order as u32
    }
    pub const fn index(self) -> usize {
        self.order as usize
    }
    pub const fn bytes(self) -> usize {
        PAGE_SIZE << self.order
    }
    pub const fn pages(self) -> usize {
        1 << self.order
    }
    /// The folio size for a region of `len` bytes where up to `max` is wanted: the largest
    /// size up to `max` that maps `len` with at most an eighth of the mapping left over.
    /// A region is rounded up to its folio size and a large folio is resident whole, so a
    /// 1 MiB block (CPython's arenas) in 2 MiB folios would hold twice its memory.
    pub fn fitting(len: usize, max: FolioSize) -> FolioSize {
        let mut folio = max;
        while folio.order > 0 {
            // A length no mapping can hold gets 4K, and the mapping's own error.
            let mapped = len.checked_next_multiple_of(folio.bytes());
            if mapped.is_some_and(|mapped| (mapped - len) * 8 <= mapped) {
                break;
            }
            folio = FolioSize { order: folio.order - 1 };
        }
        folio
    }

    pub const fn is_huge(self) -> bool {
        self.bytes() == HUGE_SIZE
    }
    /// `4K` … `2M`.
    pub fn label(self) -> &'static str {
        ["4K", "8K", "16K", "32K", "64K", "128K", "256K", "512K", "1M", "2M"][self.index()]
    }
    /// The kernel's sysfs spelling, as in `hugepages-64kB`: `4kB` … `2048kB`.
    pub fn kernel_label(self) -> &'static str {
        ["4kB", "8kB", "16kB", "32kB", "64kB", "128kB", "256kB", "512kB", "1024kB", "2048kB"][self.index()]
    }
}

impl fmt::Display for FolioSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for FolioSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, SizeError> {
        let bytes = parse_bytes(s)?;
        FolioSize::from_bytes(bytes).ok_or_else(|| size_error(s, format!("not a folio size; use {}", Self::ACCEPTED)))
    }
}

/// The compressed pool's cap: absolute, or a percentage of physical memory like zswap's
/// `max_pool_percent`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PoolLimit {
    Bytes(u64),
    Percent(f64),
}

impl PoolLimit {
    pub fn resolve(self, physical: u64) -> u64 {
        match self {
            PoolLimit::Bytes(b) => b,
            PoolLimit::Percent(p) => (physical as f64 * p / 100.0) as u64,
        }
    }
}

impl fmt::Display for PoolLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolLimit::Bytes(b) => f.write_str(&format_bytes_exact(*b)),
            PoolLimit::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl FromStr for PoolLimit {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, SizeError> {
        let t = s.trim();
        if let Some(number) = t.strip_suffix('%') {
            let p: f64 = number.trim().parse().map_err(|_| size_error(s, "expected a percentage like 20%"))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(size_error(s, "a percentage must be above 0 and at most 100"));
            }
            return Ok(PoolLimit::Percent(p));
        }
        parse_bytes(s).map(PoolLimit::Bytes)
    }
}

/// Physical memory of this machine in bytes.
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    pages.max(0) as u64 * PAGE_SIZE as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_region_gets_the_largest_folio_that_wastes_at_most_an_eighth() {
        let (mib, kib) = (1usize << 20, 1usize << 10);
        let fit = |len: usize, max: FolioSize| FolioSize::fitting(len, max).label();
        // Multiples of the largest size, and lengths that round up by under an eighth.
        assert_eq!(fit(2 * mib, FolioSize::M2), "2M");
        assert_eq!(fit(150 * mib + 32, FolioSize::M2), "2M");
        assert_eq!(fit(15 * mib, FolioSize::M2), "2M");
        // CPython's 1 MiB arenas: 2 MiB would be half empty.
        assert_eq!(fit(mib, FolioSize::M2), "1M");
        // 1 MiB and a page: 2M, 1M, 512K and 256K leave over an eighth; 128K leaves 124K of 1152K.
        assert_eq!(fit(mib + 4 * kib, FolioSize::M2), "128K");
        assert_eq!(fit(2400 * kib, FolioSize::M2), "512K");
        // Never above the largest wanted, never below 4K.
        assert_eq!(fit(mib, FolioSize::K64), "64K");
        assert_eq!(fit(mib + 1, FolioSize::K4), "4K");
        assert_eq!(fit(4 * kib + 1, FolioSize::M2), "4K");
        assert_eq!(fit(usize::MAX, FolioSize::M2), "4K");
    }

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("64K").unwrap(), 65536);
        assert_eq!(parse_bytes("64kib").unwrap(), 65536);
        assert_eq!(parse_bytes(" 2M ").unwrap(), 2 << 20);
        assert_eq!(parse_bytes("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("1T").unwrap(), 1 << 40);
        assert_eq!(parse_bytes("12B").unwrap(), 12);
        for bad in ["", "M", "12Q", "1..2M", "-1M", "1.M", "99999999999999999999", "20000000000T"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn folio_sizes() {
        assert_eq!("2M".parse::<FolioSize>().unwrap(), FolioSize::M2);
        assert_eq!("64k".parse::<FolioSize>().unwrap(), FolioSize::K64);
        assert_eq!("4096".parse::<FolioSize>().unwrap(), FolioSize::K4);
        for bad in ["3K", "4M", "2K", "0", "1G", "fast"] {
            let err = bad.parse::<FolioSize>().unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
        assert_eq!(FolioSize::ALL.iter().map(|f| f.bytes()).sum::<usize>(), (4 << 20) - 4096);
    }

    #[test]
    fn pool_limits() {
        assert_eq!("20%".parse::<PoolLimit>().unwrap(), PoolLimit::Percent(20.0));
        assert_eq!("256M".parse::<PoolLimit>().unwrap(), PoolLimit::Bytes(256 << 20));
        assert!("0%".parse::<PoolLimit>().is_err());
        assert!("150%".parse::<PoolLimit>().is_err());
        assert_eq!(PoolLimit::Percent(50.0).resolve(1000), 500);
    }

    proptest! {
        #[test]
        fn bytes_round_trip(n in 0u64..(1 << 50)) {
            let text = format_bytes(n);
            if !text.contains('.') {
                prop_assert_eq!(parse_bytes(&text).unwrap(), n);
            }
            prop_assert_eq!(parse_bytes(&n.to_string()).unwrap(), n);
        }

        #[test]
        fn suffix_scales(n in 0u64..(1 << 20), suffix in prop::sample::select(vec![("K", 10), ("m", 20), ("GiB", 30), ("kb", 10)])) {
            prop_assert_eq!(parse_bytes(&format!("{n}{}", suffix.0)).unwrap(), n << suffix.1);
        }

        #[test]
        fn folio_size_accepts_exactly_the_ten(bytes in 0u64..(8 << 20)) {
            let parsed = bytes.to_string().parse::<FolioSize>();
            let valid = (4096..=(2 << 20)).contains(&bytes) && bytes.is_power_of_two();
            prop_assert_eq!(parsed.is_ok(), valid);
            if let Ok(f) = parsed {
                prop_assert_eq!(f.bytes() as u64, bytes);
                prop_assert_eq!(f.label().parse::<FolioSize>().unwrap(), f);
            }
        }

        #[test]
        fn garbage_never_panics(s in ".{0,12}") {
            let _ = parse_bytes(&s);
            let _ = s.parse::<FolioSize>();
            let _ = s.parse::<PoolLimit>();
        }

        /// Any string, near-miss or not: no panic; an accepted one reads back from its
        /// display form; a rejected one gets an error quoting it, with a reason.
        #[test]
        fn any_size_text_parses_or_names_itself(s in size_text()) {
            match parse_bytes(&s) {
                Ok(n) => {
                    prop_assert_eq!(parse_bytes(&format_bytes_exact(n)).unwrap(), n);
                    prop_assert_eq!(parse_bytes(&n.to_string()).unwrap(), n);
                    assert_close(n, &format_bytes(n))?;
                }
                Err(e) => assert_names_input(&e, &s)?,
            }
            match s.parse::<FolioSize>() {
                Ok(f) => {
                    prop_assert_eq!(f.bytes() as u64, parse_bytes(&s).unwrap());
                    prop_assert_eq!(f.to_string().parse::<FolioSize>().unwrap(), f);
                    prop_assert_eq!(f.kernel_label(), format!("{}kB", f.bytes() / 1024));
                }
                Err(e) => {
                    assert_names_input(&e, &s)?;
                    // A size that parses but is no folio size says which ones are.
                    if parse_bytes(&s).is_ok() {
                        prop_assert!(e.reason.contains(FolioSize::ACCEPTED), "{}", e);
                    }
                }
            }
            match s.parse::<PoolLimit>() {
                Ok(p) => {
                    prop_assert_eq!(p.to_string().parse::<PoolLimit>().unwrap(), p);
                    if let PoolLimit::Percent(pct) = p {
                        prop_assert!(pct > 0.0 && pct <= 100.0);
                    }
                }
                Err(e) => assert_names_input(&e, &s)?,
            }
        }

        /// Every byte count formats to text that parses back: exactly when the text has no
        /// fraction, else to within half a tenth of its unit.
        #[test]
        fn every_format_parses_back(n in prop_oneof![any::<u64>(), (u64::MAX - (1 << 40))..=u64::MAX, 0u64..(1 << 22)]) {
            assert_close(n, &format_bytes(n))?;
            prop_assert_eq!(parse_bytes(&format_bytes_exact(n)).unwrap(), n);
        }

        /// Digits, an optional fraction and a suffix read as exactly their value (the
        /// fraction to nine digits, rounded down to a byte), or "too large" past u64.
        #[test]
        fn numbers_read_as_their_value(
            whole in "[0-9]{0,22}",
            frac in proptest::option::of("[0-9]{1,12}"),
            suffix in prop::sample::select(vec![("", 0), ("B", 0), ("k", 10), ("KiB", 10), ("M", 20), ("mb", 20), ("G", 30), ("T", 40), ("tib", 40)]),
        ) {
            let text = format!("{whole}{}{}", frac.as_ref().map(|f| format!(".{f}")).unwrap_or_default(), suffix.0);
            let got = parse_bytes(&text);
            if whole.is_empty() && frac.is_none() {
                prop_assert!(got.is_err(), "{:?} read as {:?}", text, got);
                return Ok(());
            }
            let unit = 1u128 << suffix.1;
            let mut value = whole.parse::<u128>().unwrap_or(0) * unit;
            if let Some(f) = &frac {
                let f = &f[..f.len().min(9)];
                value += f.parse::<u128>().unwrap() * unit / 10u128.pow(f.len() as u32);
            }
            match u64::try_from(value) {
                Ok(v) => prop_assert_eq!(got, Ok(v), "{}", text),
                Err(_) => prop_assert_eq!(got.map_err(|e| e.reason), Err("too large".to_string()), "{}", text),
            }
        }

        #[test]
        fn percentages_round_trip(p in prop_oneof![0.0f64..=100.0, any::<f64>(), Just(f64::MIN_POSITIVE), Just(100.0)]) {
            match format!("{p}%").parse::<PoolLimit>() {
                Ok(limit) => {
                    prop_assert_eq!(limit, PoolLimit::Percent(p));
                    prop_assert_eq!(limit.to_string().parse::<PoolLimit>().unwrap(), limit);
                }
                Err(e) => {
                    prop_assert!(!(p > 0.0 && p <= 100.0), "{p}% refused: {e}");
                    prop_assert!(e.to_string().contains(&format!("{p}%")), "{e}");
                }
            }
        }
    }

    /// Text near what sizes look like (digits, fractions, suffixes, stray characters and
    /// spaces) and arbitrary text.
    fn size_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[ \t]{0,2}[0-9]{0,22}(\\.[0-9]{0,12})?[ ]?([kKmMgGtTbB]|[kKmMgGtT][bB]|[kKmMgGtT]i[bB]|[pPeE%xX.-])?[ \t]{0,2}",
            "[+-]?[0-9]{0,4}(\\.[0-9]{0,4})?(e[+-]?[0-9]{1,3})? ?%",
            (0u64..4096, 0u32..10).prop_map(|(n, order)| format!("{}K", (n << order).max(1))),
            prop::sample::select(vec![
                "NaN%",
                "inf%",
                "-0%",
                "1e2%",
                "0.0%",
                "100.0000001%",
                ".5M",
                "5.M",
                "..",
                "1.2.3",
                "\u{a0}4K\u{a0}",
                "４K"
            ])
            .prop_map(String::from),
        ]
    }

    /// `text`, written by format_bytes for `n`, parses back to `n`, or near it if it has a
    /// fraction (a tenth of its unit, rounded to nearest).
    fn assert_close(n: u64, text: &str) -> Result<(), TestCaseError> {
        let back = parse_bytes(text).map_err(|e| TestCaseError::fail(format!("{n} formats as {text}, which does not parse: {e}")))?;
        if !text.contains('.') {
            prop_assert_eq!(back, n, "{}", text);
            return Ok(());
        }
        let shift = match text.chars().last() {
            Some('K') => 10,
            Some('M') => 20,
            Some('G') => 30,
            Some('T') => 40,
            _ => return Err(TestCaseError::fail(format!("{n} formats as {text}: a fraction without a unit"))),
        };
        let unit = 1u128 << shift;
        let error = (back as i128 - n as i128).unsigned_abs();
        // Within half a tenth (plus the byte parse_bytes rounds down); a whole tenth where
        // rounding up would have passed u64::MAX.
        let clamped = back as u128 + unit / 10 + 1 > u64::MAX as u128;
        let parts = if clamped { 10 } else { 20 };
        prop_assert!(error * parts <= unit + parts, "{} formats as {}, which reads back as {}", n, text, back);
        prop_assert!(n >= 1 << shift && (shift == 40 || n >> shift < 1024), "{} formats as {}: the wrong unit", n, text);
        Ok(())
    }

    fn assert_names_input(e: &SizeError, input: &str) -> Result<(), TestCaseError> {
        prop_assert_eq!(&e.input, input);
        prop_assert!(!e.reason.is_empty());
        prop_assert!(e.to_string().contains(&format!("{input:?}")), "{}", e);
        Ok(())
    }

    #[test]
    fn fractions_with_huge_whole_parts_are_too_large() {
        // Once read as 0.5M: the whole part that did not fit was taken for none.
        let err = parse_bytes("99999999999999999999.5M").unwrap_err();
        assert_eq!(err.reason, "too large", "{err}");
        assert_eq!(parse_bytes(".5M").unwrap(), 512 << 10);
    }

    #[test]
    fn format_edges() {
        assert_eq!(format_bytes(0), "0B");
        assert_eq!(format_bytes(1536), "1.5K");
        assert_eq!(format_bytes(1500), "1.5K");
        assert_eq!(format_bytes((1 << 20) - 1), "1024.0K");
        // Rounded down where rounding up would name more than a u64 holds.
        assert_eq!(format_bytes(u64::MAX), "16777215.9T");
        assert!(parse_bytes(&format_bytes(u64::MAX)).is_ok());
        assert_eq!(format_bytes_exact(1500), "1500");
        assert_eq!(PoolLimit::Bytes(1500).to_string(), "1500");
        assert_eq!(PoolLimit::Bytes(256 << 20).to_string(), "256M");
        assert_eq!(" 20% ".parse::<PoolLimit>().unwrap(), PoolLimit::Percent(20.0));
        assert_eq!(" 12Q ".parse::<PoolLimit>().unwrap_err().input, " 12Q ");
    }
}
