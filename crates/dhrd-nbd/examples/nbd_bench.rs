//! NBD load generator used by `bench/nbd/run.sh`: the same client for every server
//! (dhrd, nbdkit memory/file, qemu-nbd), so differences are the servers'.
//!
//! One connection per `--conns`, each keeping `--qd` requests in flight (pipelined,
//! replies in any order), for `--seconds`. Random workloads pick block-aligned offsets
//! with a fixed-seed xorshift, so every server sees the same sequence. Prints one JSON
//! object: iops, MiB/s, latency percentiles in microseconds.
//!
//! usage: nbd_bench --socket PATH --workload randread|randwrite|seqread|seqwrite
//!        [--bs BYTES] [--qd N] [--conns N] [--seconds S] [--fua] [--span BYTES]

use dhrd_nbd::client::Client;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Seed of the offset sequence (identical for every server).
const OFFSET_SEED: u64 = 0x2545_f491_4f6c_dd1d;

struct Opts {
    socket: PathBuf,
    workload: String,
    bs: u32,
    qd: usize,
    conns: usize,
    seconds: f64,
    fua: bool,
    span: Option<u64>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        socket: PathBuf::new(),
        workload: String::new(),
        bs: 4096,
        qd: 16,
        conns: 1,
        seconds: 5.0,
        fua: false,
        span: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--socket" => o.socket = PathBuf::from(val()?),
            "--workload" => o.workload = val()?,
            "--bs" => o.bs = val()?.parse().map_err(|e| format!("--bs: {e}"))?,
            "--qd" => o.qd = val()?.parse().map_err(|e| format!("--qd: {e}"))?,
            "--conns" => o.conns = val()?.parse().map_err(|e| format!("--conns: {e}"))?,
            "--seconds" => o.seconds = val()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--span" => o.span = Some(val()?.parse().map_err(|e| format!("--span: {e}"))?),
            "--fua" => o.fua = true,
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.socket.as_os_str().is_empty() || o.workload.is_empty() {
        return Err("--socket and --workload are required".into());
    }
    Ok(o)
}

struct ConnResult {
    ops: u64,
    lat_us: Vec<u32>,
}

fn run_conn(o: &Opts, conn: usize, deadline: Instant) -> Result<ConnResult, String> {
    let mut c = Client::connect(&o.socket).map_err(|e| format!("connect: {e}"))?;
    let span = o.span.unwrap_or(c.size).min(c.size);
    let blocks = span / u64::from(o.bs);
    if blocks == 0 {
        return Err("export smaller than one block".into());
    }
    let write = o.workload.ends_with("write");
    let random = o.workload.starts_with("rand");
    let payload: Vec<u8> = (0..o.bs).map(|i| (i as u8) ^ 0x5a).collect();
    let mut x = OFFSET_SEED ^ (conn as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // Sequential connections each stream their own region.
    let mut seq = (blocks / o.conns as u64) * conn as u64;
    let mut started: HashMap<u64, Instant> = HashMap::new();
    let mut r = ConnResult {
        ops: 0,
        lat_us: Vec::with_capacity(1 << 20),
    };
    loop {
        let now = Instant::now();
        while now < deadline && c.in_flight() < o.qd {
            let blk = if random {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % blocks
            } else {
                seq = (seq + 1) % blocks;
                seq
            };
            let off = blk * u64::from(o.bs);
            let h = if write {
                c.send_write(off, &payload, o.fua)
            } else {
                c.send_read(off, o.bs)
            }
            .map_err(|e| format!("send: {e}"))?;
            started.insert(h, Instant::now());
        }
        if c.in_flight() == 0 {
            break;
        }
        let rep = c.recv().map_err(|e| format!("recv: {e}"))?;
        if rep.error != 0 {
            return Err(format!("request failed with NBD error {}", rep.error));
        }
        if let Some(t) = started.remove(&rep.handle) {
            r.ops += 1;
            r.lat_us
                .push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        }
    }
    if write && !o.fua {
        // Unacknowledged durability would flatter the server: end with a flush, timed.
        c.flush().map_err(|e| format!("flush: {e}"))?;
    }
    let _ = c.disconnect();
    Ok(r)
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("nbd_bench: {e}");
            std::process::exit(2);
        }
    };
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(o.seconds);
    let results: Vec<Result<ConnResult, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..o.conns)
            .map(|i| {
                let o = &o;
                s.spawn(move || run_conn(o, i, deadline))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let mut ops = 0u64;
    let mut lat = Vec::new();
    for r in results {
        match r {
            Ok(r) => {
                ops += r.ops;
                lat.extend(r.lat_us);
            }
            Err(e) => {
                eprintln!("nbd_bench: {e}");
                std::process::exit(1);
            }
        }
    }
    lat.sort_unstable();
    let pct = |p: f64| -> u32 {
        if lat.is_empty() {
            return 0;
        }
        lat[((lat.len() - 1) as f64 * p).round() as usize]
    };
    let iops = ops as f64 / elapsed;
    println!(
        "{{\"workload\":\"{}\",\"bs\":{},\"qd\":{},\"conns\":{},\"fua\":{},\"seconds\":{:.3},\"ops\":{},\"iops\":{:.1},\"mib_s\":{:.2},\"lat_us_p50\":{},\"lat_us_p99\":{},\"lat_us_max\":{}}}",
        o.workload,
        o.bs,
        o.qd,
        o.conns,
        o.fua,
        elapsed,
        ops,
        iops,
        iops * f64::from(o.bs) / (1 << 20) as f64,
        pct(0.5),
        pct(0.99),
        lat.last().copied().unwrap_or(0)
    );
}
