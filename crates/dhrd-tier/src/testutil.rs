//! Test helpers shared by the fast-device layers' crash enumerations.

use dhrd_io::Durable;

pub(crate) mod gate;

/// Seeds per enumeration: `soak` with `DHRD_SOAK` set, else 3.
pub(crate) fn seeds(soak: u64) -> u64 {
    if std::env::var_os("DHRD_SOAK").is_some() {
        soak
    } else {
        3
    }
}

/// Equal bytes, or a panic naming the first difference (not a dump of both buffers).
pub(crate) fn same(a: &[u8], b: &[u8], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
        panic!("{what}: byte {i} is {:#x}, expected {:#x}", a[i], b[i]);
    }
}

/// All `size` bytes of `d`.
pub(crate) fn read_all<D: Durable>(d: &D, size: u64) -> Vec<u8> {
    let mut b = vec![0u8; size as usize];
    let n = d.read_at(&mut b, 0).unwrap_or_else(|e| panic!("read: {e}"));
    assert_eq!(n as u64, size);
    b
}

/// Checks `got` against the acknowledged image, allowing each byte of the one write in
/// flight at the crash (offset, bytes) to be old or new.
pub(crate) fn check(got: &[u8], acked: &[u8], inflight: Option<&(u64, Vec<u8>)>, what: &str) {
    for (i, (g, a)) in got.iter().zip(acked).enumerate() {
        if g == a {
            continue;
        }
        let ok = inflight.is_some_and(|(off, d)| {
            let i = i as u64;
            i >= *off && i < off + d.len() as u64 && d[(i - off) as usize] == *g
        });
        assert!(ok, "{what}: byte {i} is {g:#x}, acknowledged {a:#x}");
    }
}

/// A slow device that panics on writes while `armed`: a stand-in for a broken invariant in
/// the write-back.
pub(crate) struct Panicky {
    pub inner: std::sync::Arc<dhrd_io::SimBacking>,
    pub armed: std::sync::atomic::AtomicBool,
}

impl Durable for Panicky {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        assert!(
            !self.armed.load(std::sync::atomic::Ordering::SeqCst),
            "a test's broken invariant"
        );
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
}
