//! The `folioswap` command: run programs under the engine, and benchmarks of it.

mod codec;
mod kernel_swap;
mod pattern;
mod progress;
mod readahead;
mod run;
mod slots;
mod stat;
mod usemem;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "folioswap", version, about = "The kernel's modern swap design in user space: whole-folio swap through a compressed pool")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with its large anonymous memory (malloc blocks and mmaps of at
    /// least --threshold) managed by folioswap, under one memory_high for all its processes.
    Run(Box<run::RunArgs>),
    /// Benchmarks (results go in BENCHMARKS.md with their command lines).
    #[command(subcommand)]
    Bench(Bench),
    /// The live counters of every running `folioswap run`, one line per interval with the
    /// deltas, like vmstat: faults, swap-ins and -outs of the pool and the file, resident,
    /// pool, THP share, fault latency.
    Stat(stat::StatArgs),
    /// List the FOLIOSWAP_* environment variables and what they accept.
    Env,
}

#[derive(Subcommand)]
enum Bench {
    /// vm-scalability's usemem inside the engine: write every word for R rounds, verify.
    Usemem(Box<usemem::UsememArgs>),
    /// The pool's codec alone: compress/decompress speed and ratio per folio size.
    Codec(codec::CodecArgs),
    /// The swap slot allocator alone: allocations+frees per second per thread count, cluster
    /// locks and slot caches against one global lock (seed 003).
    Slots(slots::SlotsArgs),
    /// Seed 002's combined workload: sequential writers over a region larger than the limit
    /// while random writers run beside them; VMA vs slot-order readahead vs none.
    Readahead(Box<readahead::ReadaheadArgs>),
}

/// `bench usemem`: under the engine, on plain memory (the kernel side's child), or both
/// side by side.
fn bench_usemem(args: &usemem::UsememArgs) -> Result<bool, String> {
    usemem::check_args(args)?;
    if args.plain_memory {
        kernel_swap::run_plain(args)
    } else if args.against.is_some() {
        kernel_swap::against_kernel(args)
    } else {
        usemem::run(args)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => {
            return run::run(*args).unwrap_or_else(|msg| {
                eprintln!("folioswap: {msg}");
                ExitCode::from(2)
            })
        }
        Command::Bench(Bench::Usemem(args)) => bench_usemem(&args),
        Command::Bench(Bench::Codec(args)) => codec::run(args),
        Command::Bench(Bench::Slots(args)) => slots::run(args),
        Command::Bench(Bench::Readahead(args)) => readahead::run(*args),
        Command::Stat(args) => stat::run(args),
        Command::Env => {
            for (name, accepted) in folioswap::ENV_VARS {
                println!("{name:<28} {accepted}");
            }
            Ok(true)
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("folioswap: verification FAILED");
            ExitCode::from(1)
        }
        Err(msg) => {
            eprintln!("folioswap: {msg}");
            ExitCode::from(2)
        }
    }
}
