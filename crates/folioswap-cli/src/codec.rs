//! `folioswap bench codec`: what the pool's codec costs per folio, on usemem's data, on
//! text lz4 cannot shrink, or on random bytes.
//!
//! Compression, not the fault, bounds the speed of 2 MiB swapping (ARCHITECTURE.md), so
//! this measures the engine's own `Codec` (liblz4 compress; lz4_flex or liblz4 decompress by density, zstd) on
//! the words `bench usemem` writes (or `--data`), one thread, folio by folio as eviction and swap-in
//! run it. Each pass over the data is timed; the median of `--passes` is reported, and
//! every decompressed folio is compared with its original.

use crate::pattern::value;
use folioswap::{Codec, CodecScratch, Compressor, FolioSize};
use serde::Serialize;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct CodecArgs {
    /// Compressors to measure, comma-separated (lz4, zstd, zstd:LEVEL, none).
    #[arg(long, default_value = "lz4,zstd:1,zstd:3")]
    compressor: String,
    /// Folio sizes to measure, comma-separated.
    #[arg(long, default_value = "4K,64K,2M")]
    folio: String,
    /// Data per pass, in MiB.
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// Timed passes per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// The secondary codec behind each compressor (`recomp_algorithm`: zstd:1, …, or none).
    #[arg(long, default_value = "none")]
    recomp: String,
    /// The data: `usemem` (the words `bench usemem` writes: lz4 halves them), `text` (lines
    /// of 20-80 random letters and digits, as `scripts/bench_programs.py` sorts: lz4 cannot
    /// shrink them, zstd takes a third off) or `random` (bytes nothing compresses).
    #[arg(long, default_value = "usemem")]
    data: String,
    /// Print one JSON array instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    compressor: String,
    folio: String,
    compress_mb_s: f64,
    decompress_mb_s: f64,
    ratio: f64,
    compress_us_per_folio: f64,
    decompress_us_per_folio: f64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn measure(compressor: Compressor, recomp: Compressor, folio: FolioSize, data: &[u8], passes: usize) -> Result<Row, String> {
    let codec = Codec::new(compressor, recomp);
    let mut scratch = CodecScratch::new();
    let fb = folio.bytes();
    let folios = data.len() / fb;
    let mut objects: Vec<Vec<u8>> = Vec::with_capacity(folios);
    let mut comp_s = Vec::with_capacity(passes);
    for pass in 0..passes {
        let keep = pass == 0;
        let start = Instant::now();
        for chunk in data.chunks_exact(fb) {
            let n = codec.compress(chunk, &mut scratch).ok_or_else(|| format!("{compressor} failed to compress a {folio} folio"))?;
            if keep {
                objects.push(scratch.out[..n].to_vec());
            }
        }
        comp_s.push(start.elapsed().as_secs_f64());
    }
    let compressed: usize = objects.iter().map(Vec::len).sum();
    let mut out = vec![0u8; fb];
    let mut decomp_s = Vec::with_capacity(passes);
    for pass in 0..passes {
        let start = Instant::now();
        for (i, obj) in objects.iter().enumerate() {
            codec.decompress(obj, &mut out).map_err(|e| format!("{compressor} {folio}: {e}"))?;
            if pass == 0 && out[..] != data[i * fb..(i + 1) * fb] {
                return Err(format!("{compressor} {folio}: folio {i} decompressed wrong"));
            }
        }
        decomp_s.push(start.elapsed().as_secs_f64());
    }
    let (c, d) = (median(comp_s), median(decomp_s));
    let mb = (folios * fb) as f64 / 1e6;
    Ok(Row {
        compressor: if recomp == Compressor::None { compressor.to_string() } else { format!("{compressor}+{recomp}") },
        folio: folio.to_string(),
        compress_mb_s: mb / c,
        decompress_mb_s: mb / d,
        ratio: (folios * fb) as f64 / compressed as f64,
        compress_us_per_folio: c * 1e6 / folios as f64,
        decompress_us_per_folio: d * 1e6 / folios as f64,
    })
}

pub fn run(args: CodecArgs) -> Result<bool, String> {
    let compressors = args
        .compressor
        .split(',')
        .map(|c| c.trim().parse::<Compressor>().map_err(|_| format!("--compressor: {c:?} is not one of {}", Compressor::ACCEPTED)))
        .collect::<Result<Vec<_>, _>>()?;
    let folios =
        args.folio.split(',').map(|f| f.trim().parse::<FolioSize>().map_err(|e| format!("--folio: {e}"))).collect::<Result<Vec<_>, _>>()?;
    if args.passes == 0 || args.mib < 2 {
        return Err("--passes must be at least 1 and --mib at least 2".into());
    }
    let recomp: Compressor =
        args.recomp.trim().parse().map_err(|_| format!("--recomp: {:?} is not one of {}", args.recomp, Compressor::ACCEPTED))?;
    let data = sample(&args.data, args.mib << 20)?;
    let mut rows = Vec::new();
    for &c in &compressors {
        for &f in &folios {
            rows.push(measure(c, recomp, f, &data, args.passes)?);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?);
    } else {
        println!("{} data, {} MiB per pass, median of {} passes, one thread", args.data, args.mib, args.passes);
        println!(
            "{:<10} {:>6} {:>13} {:>15} {:>7} {:>14} {:>16}",
            "codec", "folio", "compress MB/s", "decompress MB/s", "ratio", "compress µs/f", "decompress µs/f"
        );
        for r in &rows {
            println!(
                "{:<10} {:>6} {:>13.0} {:>15.0} {:>7.2} {:>14.1} {:>16.1}",
                r.compressor, r.folio, r.compress_mb_s, r.decompress_mb_s, r.ratio, r.compress_us_per_folio, r.decompress_us_per_folio
            );
        }
    }
    Ok(true)
}

/// `bytes` of the data `--data` names.
fn sample(kind: &str, bytes: usize) -> Result<Vec<u8>, String> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    match kind {
        "usemem" => Ok((0..bytes as u64 / 8).flat_map(|j| value(0, j, 0).to_le_bytes()).collect()),
        "text" => {
            const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
            let mut v = Vec::with_capacity(bytes + 81);
            while v.len() < bytes {
                let len = 20 + next() % 60;
                v.extend((0..len).map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize]));
                v.push(b'\n');
            }
            v.truncate(bytes);
            Ok(v)
        }
        "random" => Ok((0..bytes / 8).flat_map(|_| next().to_le_bytes()).collect()),
        other => Err(format!("--data: {other:?} is not one of usemem, text, random")),
    }
}
