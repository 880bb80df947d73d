//! `dhrd load`: opens one backing file as a hybrid object, loads it in the background while
//! timing the first served read, and prints progress and statistics. It is the engine's
//! smoke test and the measurement behind "time to first read does not grow with size".

use anyhow::Context;
use clap::Args;
use dhrd_engine::parse_size;
use dhrd_engine::{Durability, LoaderConfig, ObjectConfig};
use dhrd_io::{DeviceProfile, WriteSync};
use dhrd_stack::{BackingConfig, Stack, StackConfig};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct LoadArgs {
    /// Backing file (created if missing) or block device.
    pub backing: PathBuf,
    /// Create or extend the file to this size (e.g. 1G, 512M).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Fill a new file with pseudo-random data first (so the load has real bytes to copy).
    #[arg(long)]
    pub fill: bool,
    /// Chunk size (power of two, 4K to 64M).
    #[arg(long, value_parser = dhrd_engine::parse_chunk_size, default_value = "1M")]
    pub chunk: u64,
    #[arg(long, default_value_t = dhrd_engine::LOADER_THREADS_DEFAULT)]
    pub loader_threads: usize,
    /// Cap the load rate (bytes per second, e.g. 200M).
    #[arg(long, value_parser = parse_size)]
    pub rate: Option<u64>,
    /// Emulate a slower device under the backing: each backing operation takes at least
    /// the profile's latency plus its transfer time on a shared bandwidth. ssd, hdd, nvm
    /// or READ_US,WRITE_US,SYNC_US,MBPS (MBPS 0: unlimited).
    #[arg(long, value_name = "PROFILE", value_parser = crate::timing::parse)]
    pub backing_timing: Option<DeviceProfile>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

fn fill_file(path: &PathBuf, size: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut rng = dhrd_io::SplitMix64::new(size);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill(&mut buf[..n]);
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    // Start from a cold cache, as after a reboot. A hint: failure only warms the cache.
    // SAFETY: posix_fadvise on a descriptor we own, plain integer arguments.
    unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    Ok(())
}

pub fn run(a: LoadArgs) -> anyhow::Result<()> {
    if a.fill {
        let size = a.size.context("--fill needs --size")?;
        fill_file(&a.backing, size)?;
    }
    let t0 = Instant::now();
    let cfg = StackConfig {
        backing: BackingConfig {
            create: true,
            min_len: a.size,
            // Nothing is written: the buffered mode opens no second descriptor.
            write_sync: Some(WriteSync::Fdatasync),
            timing: a.backing_timing,
            ..BackingConfig::new(&a.backing)
        },
        fast: None,
        adopt_cache: false,
        drop_cache_mark: false,
        chunk_bytes: Some(a.chunk),
        object: ObjectConfig {
            durability: Durability::Sync,
            loader_config: LoaderConfig {
                threads: a.loader_threads,
                rate_bytes_per_s: a.rate,
                ..Default::default()
            },
            name: String::from("dhrd-load"),
            ..Default::default()
        },
    };
    let mut stack = Stack::open(cfg)?;
    let obj = stack.object().clone();
    let mut buf = [0u8; 4096];
    obj.read_at(&mut buf, obj.len() / 2 / 4096 * 4096)?;
    let first_read = t0.elapsed();
    let mut last_print = Instant::now();
    while !obj.wait_loaded(Some(Duration::from_millis(200))) {
        let p = obj.progress();
        if p.chunks_failed > 0 || p.chunks_over_budget > 0 {
            break;
        }
        if !a.json && last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "loading {:5.1}%  {:.0} MiB/s  eta {:.1}s",
                p.fraction() * 100.0,
                p.rate_bytes_per_s / 1048576.0,
                p.eta.map_or(0.0, |d| d.as_secs_f64())
            );
            last_print = Instant::now();
        }
    }
    let full = t0.elapsed();
    let p = obj.progress();
    // Timing is reported with the result, so that a measurement says what device it was
    // taken on.
    let timing = a.backing_timing.map(|p| p.to_string());
    if a.json {
        println!(
            "{{\"bytes\":{},\"chunk_bytes\":{},\"first_read_us\":{},\"full_load_s\":{:.6},\"load_rate_bytes_per_s\":{:.0},\"chunks_loaded\":{},\"chunks_total\":{},\"backing_timing\":{}}}",
            p.bytes_total,
            p.chunk_bytes,
            first_read.as_micros(),
            full.as_secs_f64(),
            p.rate_bytes_per_s,
            p.chunks_loaded,
            p.chunks_total,
            timing.map_or_else(|| "null".to_string(), |t| format!("\"{t}\""))
        );
    } else {
        println!("backing        {}", a.backing.display());
        if let Some(t) = &timing {
            println!("backing timing {t}");
        }
        println!(
            "size           {} bytes, chunk {} bytes",
            p.bytes_total, p.chunk_bytes
        );
        println!("first read     {} us after open", first_read.as_micros());
        println!(
            "fully loaded   {:.3} s ({:.0} MiB/s)",
            full.as_secs_f64(),
            p.rate_bytes_per_s / 1048576.0
        );
        println!(
            "chunks         {}/{} loaded, {} failed, {} over budget",
            p.chunks_loaded, p.chunks_total, p.chunks_failed, p.chunks_over_budget
        );
        println!("RAM resident   {} bytes", p.ram_resident_bytes);
        print!("{}", obj.stats());
    }
    stack.close_object()?;
    Ok(())
}
