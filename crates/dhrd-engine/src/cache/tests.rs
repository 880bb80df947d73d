use super::*;
use dhrd_io::SplitMix64;

fn zipf_trace(n: usize, items: u64, s: f64, seed: u64) -> Vec<u64> {
    // Inverse-CDF sampling over ranks, ranks scattered over the item space by a fixed
    // permutation (as fio scatters its zipf ranks).
    let mut cdf = Vec::with_capacity(items as usize);
    let mut acc = 0.0;
    for k in 1..=items {
        acc += 1.0 / (k as f64).powf(s);
        cdf.push(acc);
    }
    let mut rng = SplitMix64::new(seed);
    let perm = |r: u64| (r.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 7) % items;
    (0..n)
        .map(|_| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * acc;
            let r = cdf.partition_point(|v| *v < u) as u64;
            perm(r)
        })
        .collect()
}

#[test]
fn belady_matches_a_hand_worked_trace() {
    // Capacity 2: a b c a b -> misses a, b, c (evict b? next uses: a@3, b@4 -> evict b),
    // hit a, miss b.
    let t = [1, 2, 3, 1, 2];
    assert_eq!(belady_hits(&t, 2, false), 1);
    // With bypass, c (never used again) is not cached: a and b both hit.
    assert_eq!(belady_hits(&t, 2, true), 2);
    assert_eq!(belady_hits(&t, 0, false), 0);
    assert_eq!(belady_hits(&t, 3, false), 2);
}

#[test]
fn clock_gives_a_second_chance() {
    let mut r = Residency::new(CachePolicy::Clock, Admission::Always, 2);
    let bits = SimBits(std::cell::RefCell::new(HashMap::new()));
    r.insert(1);
    r.insert(2);
    bits.set_count(1, 1);
    assert_eq!(r.victim(&bits), Some(2));
    assert_eq!(bits.count(1), 0, "passing over ages the counter");
    assert_eq!(r.victim(&bits), Some(1));
    assert_eq!(r.victim(&bits), None);
}

#[test]
fn s3fifo_protects_main_from_a_scan() {
    let cap = 100u64;
    let mut r = Residency::new(CachePolicy::S3Fifo, Admission::Always, cap);
    let bits = SimBits(std::cell::RefCell::new(HashMap::new()));
    // A hot set, hit while new, is promoted to main.
    for c in 0..90 {
        r.insert(c);
        bits.set_count(c, 1);
    }
    // A scan of cold chunks through the rest of the room and beyond.
    for c in 1000..3000 {
        if r.resident() >= cap {
            let Some(v) = r.victim(&bits) else {
                panic!("no victim with {} resident", r.resident());
            };
            bits.set_count(v, 0);
        }
        r.insert(c);
        // The hot set keeps being hit.
        for h in 0..90 {
            if bits.count(h) < ACCESS_COUNT_MAX {
                bits.set_count(h, bits.count(h) + 1);
            }
        }
    }
    assert!(
        (0..90).all(|c| r.contains(c)),
        "the scan evicted a hot chunk"
    );
}

#[test]
fn second_access_admission_bypasses_one_off_reads() {
    let mut r = Residency::new(CachePolicy::S3Fifo, Admission::SecondAccess, 10);
    assert_eq!(r.on_miss(5), Admit::Bypass);
    assert_eq!(r.on_miss(5), Admit::Load);
    r.insert(5);
    // An evicted chunk comes back at its first miss (the ghost remembers it).
    let bits = SimBits(std::cell::RefCell::new(HashMap::new()));
    assert_eq!(r.victim(&bits), Some(5));
    assert_eq!(r.on_miss(5), Admit::Load);
    // The history is bounded.
    for c in 100..100 + 10 * HISTORY_MIN {
        r.on_miss(c);
    }
    let (missed, ghost) = r.history_len();
    assert!(missed as u64 <= HISTORY_MIN && ghost as u64 <= HISTORY_MIN);
}

#[test]
fn removed_and_requeued_chunks_leave_no_live_duplicates() {
    let mut r = Residency::new(CachePolicy::S3Fifo, Admission::Always, 8);
    let bits = SimBits(std::cell::RefCell::new(HashMap::new()));
    let mut rng = SplitMix64::new(7);
    let mut live = std::collections::BTreeSet::new();
    for _ in 0..20_000 {
        let c = rng.next_u64() % 32;
        match rng.next_u64() % 4 {
            0 => {
                r.insert(c);
                live.insert(c);
            }
            1 => {
                r.remove(c);
                live.remove(&c);
            }
            2 => bits.set_count(c, (rng.next_u64() % 4) as u8),
            _ => {
                if let Some(v) = r.victim(&bits) {
                    assert!(live.remove(&v), "victim {v} was not resident");
                }
            }
        }
        assert_eq!(r.resident(), live.len() as u64);
        assert!(r.small.len() + r.main.len() <= 2 * live.len() + 64 + 1);
    }
}

#[test]
fn policies_come_near_the_optimum_on_zipf_and_survive_a_scan() {
    let items = 16_384u64;
    let cap = items / 4;
    let t = zipf_trace(200_000, items, 1.2, 1);
    let opt = belady_hits(&t, cap, true) as f64 / t.len() as f64;
    let s3 = simulate(&t, CachePolicy::S3Fifo, Admission::SecondAccess, cap).hit_ratio();
    assert!(s3 >= 0.8 * opt, "s3fifo {s3:.3} vs optimum {opt:.3}");
    // The same with a one-pass scan of every chunk in the middle: hits on the zipf
    // accesses after the scan starts, against the same accesses without the scan.
    let half = t.len() / 2;
    let mut scanned = t[..half].to_vec();
    scanned.extend(0..items);
    scanned.extend_from_slice(&t[half..]);
    for policy in [CachePolicy::S3Fifo, CachePolicy::Clock] {
        let mut base_hits = 0u64;
        simulate_each(&t, policy, Admission::SecondAccess, cap, |i, hit| {
            if i >= half && hit {
                base_hits += 1;
            }
        });
        let mut scan_hits = 0u64;
        let scan_end = half + items as usize;
        simulate_each(&scanned, policy, Admission::SecondAccess, cap, |i, hit| {
            if i >= scan_end && hit {
                scan_hits += 1;
            }
        });
        assert!(
            scan_hits as f64 >= 0.9 * base_hits as f64,
            "{policy}: {scan_hits} hits after a scan against {base_hits} without it"
        );
    }
}
