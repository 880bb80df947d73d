//! `dhrd-bench video`: the paper's video-editing experiment (read a large file, modify part
//! of it, save the result as a new file; three times) for any directory.
//!
//! What it measures: `video-0` (`--bytes`, pseudo-random content) is written and fsynced
//! once, untimed. Then round i (1-based) streams `video-{i-1}` in `--block` reads, xors a
//! contiguous region of `--modify-percent` of the file in the middle with a per-round
//! byte key, and writes every block to a new file `video-{i}` (fsynced at the end, inside
//! the timing, with `--fsync`). Per round: seconds spent in read calls, in write calls
//! (with open, close and fsync), the round's wall time, and MiB/s of file processed.
//!
//! Invariants and verification:
//! - Blocks are processed strictly in order with one buffer: the workload is a stream,
//!   like an editor exporting a file, so memory stays at one block whatever `--bytes`.
//! - The content of every file is a pure function of (seed, round keys, region), so the
//!   expected content of the last file is known without I/O. At the end (untimed) the
//!   expected checksum is computed in memory from that model, the checksum of what the
//!   last round wrote was computed while writing, and the last file is read back; all
//!   three must agree or the run fails (files kept for inspection). A read that returned
//!   wrong data in any round shows up as a model mismatch even though the written and
//!   read-back checksums agree.
//! - Existing `video-*` files are never overwritten (O_EXCL), so a leftover from an
//!   earlier run is an error, not silently reused.

use crate::fileio::{
    close_checked, emit, fsync, parse_size, r3, r6, read_full, syncfs, Checksum, MIB,
};
use anyhow::{bail, ensure, Context};
use dhrd_io::SplitMix64;
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bounds of the parameters.
const BYTES_MAX: u64 = 1 << 40;
const ROUNDS_MAX: u32 = 1000;
const BLOCK_MIN: u64 = 4096;
const BLOCK_MAX: u64 = 256 * MIB;
/// Blocks must be whole multiples of this (the checksum's stride; the PRNG's word).
const BLOCK_ALIGN: u64 = 4096;

const _: () =
    assert!(BLOCK_MIN.is_multiple_of(BLOCK_ALIGN) && BLOCK_MAX.is_multiple_of(BLOCK_ALIGN));

#[derive(clap::Args)]
pub struct VideoArgs {
    /// Directory to run in (any file system); files video-0..video-ROUNDS go there and
    /// must not exist.
    #[arg(long)]
    pub dir: PathBuf,
    /// Size of the video file.
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    pub bytes: u64,
    /// Read-modify-write rounds (each makes a new file).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Percentage of the file modified per round (a contiguous region in the middle).
    #[arg(long, default_value_t = 10)]
    pub modify_percent: u64,
    /// Size of each read and write (multiple of 4 KiB).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub block: u64,
    /// fsync each new file at the end of its round (timed).
    #[arg(long)]
    pub fsync: bool,
    /// After creating video-0, drop the page cache: write 1 to /proc/sys/vm/drop_caches
    /// when root (and allowed), else posix_fadvise(DONTNEED) on video-0.
    #[arg(long)]
    pub drop_cache: bool,
    /// Seed of the file's content.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Leave the files in place (default: delete them, timed).
    #[arg(long)]
    pub keep: bool,
}

fn name(i: u32) -> String {
    format!("video-{i}")
}

/// The byte round `round` (1-based) xors into the region; never zero, so every round
/// changes the file.
fn round_key(round: u32) -> u8 {
    ((u64::from(round).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8) | 1
}

/// The modified region `[offset, offset + len)` of a file of `bytes`.
fn region(bytes: u64, percent: u64) -> (u64, u64) {
    let len = (u128::from(bytes) * u128::from(percent) / 100) as u64;
    ((bytes - len) / 2, len)
}

/// Xors `key` into the part of `buf` (which holds file bytes from `off`) that falls in
/// the region.
fn xor_region(buf: &mut [u8], off: u64, (r_off, r_len): (u64, u64), key: u8) {
    let lo = off.max(r_off);
    let hi = (off + buf.len() as u64).min(r_off + r_len);
    if lo < hi {
        let s = (lo - off) as usize..(hi - off) as usize;
        for b in buf.get_mut(s).unwrap_or_default() {
            *b ^= key;
        }
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

struct Round {
    read: Duration,
    write: Duration,
    total: Duration,
    checksum: u64,
}

/// One round: stream `src` into a new `dst`, modifying the region.
fn edit(
    a: &VideoArgs,
    src: &Path,
    dst: &Path,
    round: u32,
    buf: &mut [u8],
) -> anyhow::Result<Round> {
    let reg = region(a.bytes, a.modify_percent);
    let key = round_key(round);
    let (mut read, mut write) = (Duration::ZERO, Duration::ZERO);
    let mut sum = Checksum::default();
    let start = Instant::now();
    let t = Instant::now();
    let mut input = File::open(src).with_context(|| format!("read: open {}", src.display()))?;
    read += t.elapsed();
    let t = Instant::now();
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .with_context(|| format!("write: create {}", dst.display()))?;
    write += t.elapsed();
    let mut off = 0u64;
    loop {
        let t = Instant::now();
        let n = read_full(&mut input, buf).with_context(|| format!("read {}", src.display()))?;
        read += t.elapsed();
        if n == 0 {
            break;
        }
        ensure!(
            off + n as u64 <= a.bytes,
            "{} is longer than {} bytes",
            src.display(),
            a.bytes
        );
        let block = &mut buf[..n];
        xor_region(block, off, reg, key);
        sum.update(block);
        let t = Instant::now();
        out.write_all(block)
            .with_context(|| format!("write {}", dst.display()))?;
        write += t.elapsed();
        off += n as u64;
    }
    ensure!(
        off == a.bytes,
        "{} has {off} bytes, expected {}",
        src.display(),
        a.bytes
    );
    let t = Instant::now();
    if a.fsync {
        fsync(&out, dst, "write")?;
    }
    close_checked(out, dst, "write")?;
    write += t.elapsed();
    let t = Instant::now();
    close_checked(input, src, "read")?;
    read += t.elapsed();
    Ok(Round {
        read,
        write,
        total: start.elapsed(),
        checksum: sum.finish(),
    })
}

/// Writes `video-0` (untimed for the rounds; returns its checksum).
fn create_source(a: &VideoArgs, path: &Path, buf: &mut [u8]) -> anyhow::Result<u64> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    let mut r = SplitMix64::new(a.seed);
    let mut sum = Checksum::default();
    let mut off = 0u64;
    while off < a.bytes {
        let n = (a.bytes - off).min(buf.len() as u64) as usize;
        let block = &mut buf[..n];
        r.fill(block);
        sum.update(block);
        f.write_all(block)
            .with_context(|| format!("write {}", path.display()))?;
        off += n as u64;
    }
    fsync(&f, path, "create")?;
    close_checked(f, path, "create")?;
    Ok(sum.finish())
}

/// The checksum the last file must have, from the model (no I/O).
fn expected_checksum(a: &VideoArgs, buf: &mut [u8]) -> u64 {
    let reg = region(a.bytes, a.modify_percent);
    let key = (1..=a.rounds).fold(0u8, |k, i| k ^ round_key(i));
    let mut r = SplitMix64::new(a.seed);
    let mut sum = Checksum::default();
    let mut off = 0u64;
    while off < a.bytes {
        let n = (a.bytes - off).min(buf.len() as u64) as usize;
        let block = &mut buf[..n];
        r.fill(block);
        xor_region(block, off, reg, key);
        sum.update(block);
        off += n as u64;
    }
    sum.finish()
}

fn read_back_checksum(path: &Path, buf: &mut [u8]) -> anyhow::Result<u64> {
    let mut f = File::open(path).with_context(|| format!("verify: open {}", path.display()))?;
    let mut sum = Checksum::default();
    loop {
        let n =
            read_full(&mut f, buf).with_context(|| format!("verify: read {}", path.display()))?;
        if n == 0 {
            break;
        }
        sum.update(&buf[..n]);
    }
    close_checked(f, path, "verify")?;
    Ok(sum.finish())
}

/// Drops video-0 from the page cache; returns how ("drop_caches" or "fadvise").
fn drop_cache(dir: &Path, src: &Path) -> anyhow::Result<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        syncfs(dir)?;
        // Not allowed in some containers even as root (read-only /proc/sys); then the
        // per-file hint below still drops this file's pages.
        if std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok() {
            return Ok("drop_caches");
        }
    }
    let f = File::open(src).with_context(|| format!("drop cache: open {}", src.display()))?;
    // SAFETY: a hint on a descriptor we own.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc))
            .with_context(|| format!("drop cache: posix_fadvise {}", src.display()));
    }
    close_checked(f, src, "drop cache")?;
    Ok("fadvise")
}

fn check(a: &VideoArgs) -> anyhow::Result<()> {
    ensure!(
        (1..=BYTES_MAX).contains(&a.bytes),
        "--bytes must be 1..={BYTES_MAX}"
    );
    ensure!(
        (1..=ROUNDS_MAX).contains(&a.rounds),
        "--rounds must be 1..={ROUNDS_MAX}"
    );
    ensure!(a.modify_percent <= 100, "--modify-percent must be 0..=100");
    ensure!(
        (BLOCK_MIN..=BLOCK_MAX).contains(&a.block) && a.block.is_multiple_of(BLOCK_ALIGN),
        "--block must be a multiple of {BLOCK_ALIGN} in {BLOCK_MIN}..={BLOCK_MAX}"
    );
    ensure!(
        a.dir.is_dir(),
        "--dir {} is not a directory",
        a.dir.display()
    );
    for i in 0..=a.rounds {
        let p = a.dir.join(name(i));
        if p.symlink_metadata().is_ok() {
            bail!(
                "{} already exists (left by a run with --keep or one that failed); remove \
                 it or choose another --dir",
                p.display()
            );
        }
    }
    Ok(())
}

fn remove_files(a: &VideoArgs) -> anyhow::Result<()> {
    for i in 0..=a.rounds {
        let p = a.dir.join(name(i));
        std::fs::remove_file(&p).with_context(|| format!("cleanup: unlink {}", p.display()))?;
    }
    Ok(())
}

pub fn run(a: VideoArgs) -> anyhow::Result<()> {
    check(&a)?;
    match run_checked(&a) {
        Ok(None) => Ok(()),
        // Wrong data: the files are evidence, so they stay.
        Ok(Some(mismatch)) => bail!(mismatch),
        Err(e) => {
            // Remove what this run made (best effort: the error is the news).
            if !a.keep {
                for i in 0..=a.rounds {
                    let _ = std::fs::remove_file(a.dir.join(name(i)));
                }
            }
            Err(e)
        }
    }
}

/// Runs and reports; returns a description of the mismatch when verification failed.
fn run_checked(a: &VideoArgs) -> anyhow::Result<Option<String>> {
    let mut buf = vec![0u8; a.block as usize];
    let src0 = a.dir.join(name(0));
    let t = Instant::now();
    create_source(a, &src0, &mut buf)?;
    let create_secs = t.elapsed().as_secs_f64();
    let cache_drop = if a.drop_cache {
        drop_cache(&a.dir, &src0)?
    } else {
        "none"
    };

    let mib = a.bytes as f64 / MIB as f64;
    let mut rounds = Vec::new();
    let (mut read, mut write, mut total) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut last_written = 0u64;
    for i in 1..=a.rounds {
        let (src, dst) = (a.dir.join(name(i - 1)), a.dir.join(name(i)));
        let r = edit(a, &src, &dst, i, &mut buf)?;
        read += r.read;
        write += r.write;
        total += r.total;
        last_written = r.checksum;
        rounds.push(json!({
            "round": i,
            "src": name(i - 1),
            "dst": name(i),
            "read_secs": r6(secs(r.read)),
            "write_secs": r6(secs(r.write)),
            "total_secs": r6(secs(r.total)),
            "mib_per_sec": r3(mib / secs(r.total)),
            "read_mib_per_sec": r3(mib / secs(r.read)),
            "write_mib_per_sec": r3(mib / secs(r.write)),
            "checksum": format!("{:016x}", r.checksum),
        }));
    }

    let t = Instant::now();
    let expected = expected_checksum(a, &mut buf);
    let last = a.dir.join(name(a.rounds));
    let read_back = read_back_checksum(&last, &mut buf)?;
    let verify_secs = t.elapsed().as_secs_f64();
    let verified = expected == last_written && read_back == last_written;

    let cleanup_secs = if a.keep || !verified {
        None
    } else {
        let t = Instant::now();
        remove_files(a)?;
        Some(t.elapsed().as_secs_f64())
    };
    let total_mib_per_sec = mib * f64::from(a.rounds) / secs(total);
    let (off, len) = region(a.bytes, a.modify_percent);
    let out = json!({
        "benchmark": "video",
        "dir": a.dir.display().to_string(),
        "config": {
            "bytes": a.bytes,
            "rounds": a.rounds,
            "modify_percent": a.modify_percent,
            "block_bytes": a.block,
            "fsync": a.fsync,
            "drop_cache": a.drop_cache,
            "seed": a.seed,
            "keep": a.keep,
        },
        "modify_offset_bytes": off,
        "modify_bytes": len,
        "create_secs": r6(create_secs),
        "cache_drop": cache_drop,
        "rounds": rounds,
        "read_secs": r6(secs(read)),
        "write_secs": r6(secs(write)),
        "total_secs": r6(secs(total)),
        "mib_per_sec": r3(total_mib_per_sec),
        "checksum_expected": format!("{expected:016x}"),
        "checksum_written": format!("{last_written:016x}"),
        "checksum_read_back": format!("{read_back:016x}"),
        "verified": verified,
        "verify_secs": r6(verify_secs),
        "kept": cleanup_secs.is_none(),
        "cleanup_secs": cleanup_secs.map(r6),
    });
    let summary = format!(
        "video: {} rounds of {mib:.0} MiB in {:.2} s ({total_mib_per_sec:.1} MiB/s; read {:.2} s, \
         write {:.2} s), create {create_secs:.2} s, checksum {}",
        a.rounds,
        secs(total),
        secs(read),
        secs(write),
        if verified { "verified" } else { "MISMATCH" },
    );
    emit(&out, &summary)?;
    Ok((!verified).then(|| {
        format!(
            "checksum mismatch on {}: expected {expected:016x} (model), written \
             {last_written:016x}, read back {read_back:016x}; files kept in {}",
            last.display(),
            a.dir.display()
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_is_centred_and_sized() {
        assert_eq!(region(1000, 10), (450, 100));
        assert_eq!(region(1000, 0), (500, 0));
        assert_eq!(region(1000, 100), (0, 1000));
    }

    #[test]
    fn xor_touches_only_the_region() {
        let mut b = vec![0u8; 16];
        xor_region(&mut b, 100, (104, 100), 0xFF);
        assert_eq!(&b[..4], &[0; 4]);
        assert!(b[4..].iter().all(|&x| x == 0xFF));
        let mut c = vec![0u8; 16];
        xor_region(&mut c, 0, (104, 100), 0xFF);
        assert!(c.iter().all(|&x| x == 0));
    }

    #[test]
    fn round_keys_are_nonzero() {
        assert!((1..=ROUNDS_MAX).all(|i| round_key(i) != 0));
    }
}
