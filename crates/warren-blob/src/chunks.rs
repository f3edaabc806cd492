//! Chunk tables: the sha256 of every fixed-size chunk of a layer blob, so that a chunk read
//! on its own can be verified before it is served.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

use crate::BlobError;

/// Chunk size of new tables (512 KiB).
pub const DEFAULT_CHUNK_SIZE: u64 = 512 * 1024;

/// The per-chunk digests of one blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkTable {
    /// `sha256:<hex>` of the whole blob.
    pub digest: String,
    pub size: u64,
    pub chunk_size: u64,
    /// Hex sha256 of each chunk, in order (the last one may be short).
    pub chunks: Vec<String>,
}

impl ChunkTable {
    /// Reads a file once, computing the whole digest and the chunk digests.
    pub fn compute(path: &Path, chunk_size: u64) -> Result<ChunkTable, BlobError> {
        let mut f = std::fs::File::open(path)
            .map_err(|e| BlobError::io(format!("open {}", path.display()), e))?;
        let mut whole = Sha256::new();
        let mut chunks = Vec::new();
        let mut buf = vec![0u8; chunk_size as usize];
        let mut size = 0u64;
        loop {
            let mut n = 0;
            while n < buf.len() {
                let k = f
                    .read(&mut buf[n..])
                    .map_err(|e| BlobError::io(format!("read {}", path.display()), e))?;
                if k == 0 {
                    break;
                }
                n += k;
            }
            if n == 0 {
                break;
            }
            whole.update(&buf[..n]);
            chunks.push(hex::encode(Sha256::digest(&buf[..n])));
            size += n as u64;
            if n < buf.len() {
                break;
            }
        }
        Ok(ChunkTable {
            digest: format!("sha256:{}", hex::encode(whole.finalize())),
            size,
            chunk_size,
            chunks,
        })
    }

    /// Checks the table is self-consistent and belongs to `digest`.
    pub fn check(&self, digest: &str) -> Result<(), BlobError> {
        let bad = |m: &str| BlobError::Corrupt {
            key: digest.to_string(),
            message: format!("chunk table: {m}"),
        };
        if self.digest != digest {
            return Err(bad(&format!("is for {}", self.digest)));
        }
        if self.chunk_size == 0 || self.chunk_size > 64 << 20 {
            return Err(bad("bad chunk size"));
        }
        if self.chunks.len() as u64 != self.size.div_ceil(self.chunk_size) {
            return Err(bad("chunk count does not match the size"));
        }
        if self
            .chunks
            .iter()
            .any(|c| c.len() != 64 || !c.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(bad("bad chunk digest"));
        }
        Ok(())
    }

    /// Byte range of chunk `i`.
    pub fn range(&self, i: usize) -> std::ops::Range<u64> {
        let a = i as u64 * self.chunk_size;
        a..(a + self.chunk_size).min(self.size)
    }

    /// Verifies the bytes of chunk `i`.
    pub fn verify(&self, i: usize, data: &[u8]) -> Result<(), BlobError> {
        let r = self.range(i);
        if data.len() as u64 != r.end - r.start {
            return Err(BlobError::Corrupt {
                key: self.digest.clone(),
                message: format!(
                    "chunk {i} is truncated: {} of {} bytes",
                    data.len(),
                    r.end - r.start
                ),
            });
        }
        let found = hex::encode(Sha256::digest(data));
        if found != self.chunks[i] {
            return Err(BlobError::Corrupt {
                key: self.digest.clone(),
                message: format!("chunk {i} has sha256 {found}, expected {}", self.chunks[i]),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_verifies_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let t = ChunkTable::compute(&p, 4096).unwrap();
        assert_eq!(t.chunks.len(), 3);
        assert_eq!(t.size, 10_000);
        t.check(&t.digest.clone()).unwrap();
        t.verify(2, &data[8192..]).unwrap();
        assert!(t.verify(2, &data[8192..9000]).is_err());
        let mut bad = data[..4096].to_vec();
        bad[7] ^= 1;
        assert!(matches!(t.verify(0, &bad), Err(BlobError::Corrupt { .. })));
        assert!(t.check("sha256:00").is_err());
    }
}
