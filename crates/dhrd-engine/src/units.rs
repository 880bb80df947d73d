//! Newtypes and chunk arithmetic. A chunk index and a byte offset are never interchangeable.

use std::fmt;

/// Index of a chunk within one object: chunk `i` covers bytes `[i*chunk_bytes, (i+1)*chunk_bytes)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkIndex(pub u64);

impl fmt::Display for ChunkIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chunk {}", self.0)
    }
}

/// Smallest and largest chunk sizes accepted (the default was chosen from a sweep of
/// 256 KiB to 4 MiB; tests use smaller chunks to exercise boundaries).
pub const CHUNK_BYTES_MIN: u64 = 4096;
pub const CHUNK_BYTES_MAX: u64 = 64 << 20;

/// Chunk geometry of one object (chunk size is a power of two, fixed per object).
#[derive(Debug, Clone, Copy)]
pub struct ChunkGeometry {
    shift: u32,
}

impl ChunkGeometry {
    pub fn new(chunk_bytes: u64) -> Option<Self> {
        let ok = chunk_bytes.is_power_of_two()
            && (CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&chunk_bytes);
        ok.then(|| Self {
            shift: chunk_bytes.trailing_zeros(),
        })
    }

    pub fn chunk_bytes(&self) -> u64 {
        1 << self.shift
    }

    pub fn index_of(&self, offset: u64) -> ChunkIndex {
        ChunkIndex(offset >> self.shift)
    }

    pub fn start_of(&self, c: ChunkIndex) -> u64 {
        c.0 << self.shift
    }

    pub fn end_of(&self, c: ChunkIndex) -> u64 {
        (c.0 + 1) << self.shift
    }

    /// Number of chunks needed to cover `len` bytes.
    pub fn chunks_for(&self, len: u64) -> u64 {
        len.div_ceil(self.chunk_bytes())
    }

    /// Splits `[offset, offset+len)` at chunk boundaries (I6).
    pub fn pieces(&self, offset: u64, len: u64) -> Pieces {
        Pieces {
            geo: *self,
            pos: offset,
            end: offset + len,
        }
    }
}

/// One piece of a request: the part that falls into a single chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub chunk: ChunkIndex,
    pub offset: u64,
    pub len: u64,
}

pub struct Pieces {
    geo: ChunkGeometry,
    pos: u64,
    end: u64,
}

impl Iterator for Pieces {
    type Item = Piece;
    fn next(&mut self) -> Option<Piece> {
        if self.pos >= self.end {
            return None;
        }
        let chunk = self.geo.index_of(self.pos);
        let stop = self.geo.end_of(chunk).min(self.end);
        let p = Piece {
            chunk,
            offset: self.pos,
            len: stop - self.pos,
        };
        self.pos = stop;
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_at_boundaries() {
        let g = ChunkGeometry::new(4096).unwrap_or_else(|| unreachable!());
        let v: Vec<Piece> = g.pieces(4000, 5000).collect();
        assert_eq!(
            v,
            vec![
                Piece {
                    chunk: ChunkIndex(0),
                    offset: 4000,
                    len: 96
                },
                Piece {
                    chunk: ChunkIndex(1),
                    offset: 4096,
                    len: 4096
                },
                Piece {
                    chunk: ChunkIndex(2),
                    offset: 8192,
                    len: 808
                },
            ]
        );
        assert!(ChunkGeometry::new(3000).is_none());
        assert_eq!(g.chunks_for(0), 0);
        assert_eq!(g.chunks_for(4097), 2);
    }
}

/// Parses a byte count as users write it on command lines: `4096`, `64K`, `512M`, `1G`,
/// `1GiB`, `2T` (binary units; case and a `B`/`iB` suffix are optional).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let n: u64 = num.parse().map_err(|_| {
        format!("bad size {s:?}: use a number with an optional K, M, G or T suffix")
    })?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("bad size unit in {s:?} (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// A chunk size as `parse_size` reads it, refused unless [`ChunkGeometry`] takes it (a
/// power of two from [`CHUNK_BYTES_MIN`] to [`CHUNK_BYTES_MAX`]): command lines check it
/// before anything is created or opened.
pub fn parse_chunk_size(s: &str) -> std::result::Result<u64, String> {
    let n = parse_size(s)?;
    match ChunkGeometry::new(n) {
        Some(_) => Ok(n),
        None => Err(format!(
            "chunk size {s:?} must be a power of two from {}K to {}M",
            CHUNK_BYTES_MIN >> 10,
            CHUNK_BYTES_MAX >> 20
        )),
    }
}

#[cfg(test)]
mod size_tests {
    use super::{parse_chunk_size, parse_size};

    #[test]
    fn chunk_sizes_are_powers_of_two_in_range() {
        assert_eq!(parse_chunk_size("1M"), Ok(1 << 20));
        assert_eq!(parse_chunk_size("4K"), Ok(4096));
        assert_eq!(parse_chunk_size("64M"), Ok(64 << 20));
        for bad in ["3K", "0", "2K", "128M", "1000000"] {
            match parse_chunk_size(bad) {
                Err(e) => assert!(e.contains("power of two from 4K to 64M"), "{bad}: {e}"),
                Ok(n) => panic!("{bad} accepted as {n}"),
            }
        }
        assert!(parse_chunk_size("1Q").is_err());
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("16K"), Ok(16 << 10));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size(" 1GiB "), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
