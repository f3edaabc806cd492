//! The bytes of one stored entry.
//!
//! Every call that changes a sandbox writes an entry, also past the sandbox's budget, so an
//! entry's size is what a long episode costs the node's disk per call. An entry is its JSON
//! without the request digest (it is recomputed from the request on read), compressed by zstd
//! with a dictionary of typical entries ([`DICT_V1`]): what is left is mostly the output
//! digests, the command and the times, about 100 bytes for an exec.
//!
//! The first byte says how the rest is stored:
//! - [`ZSTD_DICT1`]: zstd with [`DICT_V1`] (written);
//! - [`DEFLATED`]: deflated JSON (written by earlier nodes, still read);
//! - `{`: plain JSON (older nodes, still read).
//!
//! The dictionary is part of the format: entries written with it can only be read with the
//! very same bytes, so [`DICT_V1`] never changes (a test pins its digest); a better one is a
//! new tag.

use std::cell::RefCell;
use std::io::Read;
use std::sync::OnceLock;

use super::{hex, request_digest, StoredEntry};

/// zstd with [`DICT_V1`].
const ZSTD_DICT1: u8 = 2;
/// Deflated JSON (read only).
const DEFLATED: u8 = 1;

/// Entries of every kind as this build writes them (no request digest), exec last: a raw
/// zstd dictionary matches best near its end.
const DICT_V1: &[u8] = include_bytes!("dict-v1.json");

/// Compression level. Every call that changes a sandbox compresses its entry before it
/// answers, so this is on the exec path: level 9 takes about 9 µs for an exec entry where 19
/// took 150 µs, for 2 % more bytes (173 against 169 of 843 JSON bytes). Readers do not
/// depend on the level.
const LEVEL: i32 = 9;

/// Largest entry [`StoredEntry::decode`] inflates (a stored entry is a few hundred bytes; this
/// bounds what a damaged file can cost).
const MAX_ENTRY: u64 = 16 << 20;

/// Why a stored entry could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("decompress: {0}")]
    Inflate(#[from] std::io::Error),
    #[error("entry larger than {MAX_ENTRY} bytes once decompressed")]
    TooLarge,
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

fn decoder_dict() -> &'static zstd::dict::DecoderDictionary<'static> {
    static D: OnceLock<zstd::dict::DecoderDictionary<'static>> = OnceLock::new();
    D.get_or_init(|| zstd::dict::DecoderDictionary::copy(DICT_V1))
}

thread_local! {
    /// One decompressor per thread, with the prepared dictionary (making a context per entry
    /// cost more than the decompression).
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    /// One compressor per thread, its dictionary loaded once (a context costs a few hundred
    /// KiB; threads are few).
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
}

fn compress(json: &[u8]) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            let mut z = zstd::bulk::Compressor::with_dictionary(LEVEL, DICT_V1)?;
            // The record around the entry has its own length and checksum.
            z.include_checksum(false)?;
            *c = Some(z);
        }
        let z = c.as_mut().expect("compressor set above");
        let mut out = Vec::with_capacity(json.len() / 3 + 32);
        out.push(ZSTD_DICT1);
        let mut body = z.compress(json)?;
        out.append(&mut body);
        Ok(out)
    })
}

/// Decompresses a [`ZSTD_DICT1`] body: in one call when the frame says its size (every frame
/// [`compress`] writes does), else as a bounded stream.
fn decompress(z: &[u8]) -> Result<Vec<u8>, DecodeError> {
    match zstd::zstd_safe::get_frame_content_size(z) {
        Ok(Some(n)) if n > MAX_ENTRY => Err(DecodeError::TooLarge),
        Ok(Some(n)) => DECOMPRESSOR.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::with_prepared_dictionary(
                    decoder_dict(),
                )?);
            }
            let d = d.as_mut().expect("decompressor set above");
            let out = d.decompress(z, n as usize)?;
            if out.len() as u64 != n {
                return Err(DecodeError::Inflate(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "entry shorter than its frame says",
                )));
            }
            Ok(out)
        }),
        _ => {
            let d = zstd::stream::read::Decoder::with_prepared_dictionary(z, decoder_dict())?;
            bounded(d, z.len() * 6)
        }
    }
}

/// Reads at most [`MAX_ENTRY`] + 1 bytes of `r`.
fn bounded(mut r: impl Read, hint: usize) -> Result<Vec<u8>, DecodeError> {
    let mut json = Vec::with_capacity(hint);
    (&mut r).take(MAX_ENTRY + 1).read_to_end(&mut json)?;
    if json.len() as u64 > MAX_ENTRY {
        return Err(DecodeError::TooLarge);
    }
    Ok(json)
}

impl StoredEntry {
    /// The entry as stored (see the module).
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        let json = if self.request_sha256 == hex(&request_digest(&self.call)) {
            let mut e = self.clone();
            e.request_sha256.clear();
            serde_json::to_vec(&e)?
        } else {
            serde_json::to_vec(self)?
        };
        // Compressing into memory cannot fail but for memory; plain JSON is still readable.
        Ok(compress(&json).unwrap_or(json))
    }

    /// Reads an entry as [`StoredEntry::encode`] (or an older node) wrote it.
    pub fn decode(bytes: &[u8]) -> Result<StoredEntry, DecodeError> {
        let mut e: StoredEntry = match bytes.split_first() {
            Some((&ZSTD_DICT1, z)) => serde_json::from_slice(&decompress(z)?)?,
            Some((&DEFLATED, z)) => {
                let d = flate2::read::DeflateDecoder::new(z);
                serde_json::from_slice(&bounded(d, z.len() * 3)?)?
            }
            _ => serde_json::from_slice(bytes)?,
        };
        if e.request_sha256.is_empty() {
            e.request_sha256 = hex(&request_digest(&e.call));
        }
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::sha256;

    fn exec_entry(i: u64) -> StoredEntry {
        let mut e = crate::trajectory::flood_entry(i);
        e.step = Some(7);
        e
    }

    #[test]
    fn entries_are_small_and_read_back_whole() {
        let e = exec_entry(42);
        let json = serde_json::to_vec(&e).unwrap();
        let stored = e.encode().unwrap();
        assert_eq!(stored[0], ZSTD_DICT1);
        // An exec past the budget: two digests, the command and the times are what is left.
        assert!(
            stored.len() * 5 < json.len(),
            "{} bytes stored for {} of JSON",
            stored.len(),
            json.len()
        );
        let back = StoredEntry::decode(&stored).unwrap();
        assert_eq!(back, e, "the request digest is recomputed");
        // An entry whose digest is not its request's (never written so, but kept if found).
        let mut odd = e.clone();
        odd.request_sha256 = hex(&sha256(b"other"));
        assert_eq!(StoredEntry::decode(&odd.encode().unwrap()).unwrap(), odd);
    }

    #[test]
    fn older_deflated_and_plain_json_entries_still_read() {
        use std::io::Write;
        let e = exec_entry(1);
        let json = serde_json::to_vec(&e).unwrap();
        let mut z = flate2::write::DeflateEncoder::new(vec![DEFLATED], flate2::Compression::fast());
        z.write_all(&json).unwrap();
        let deflated = z.finish().unwrap();
        assert_eq!(StoredEntry::decode(&deflated).unwrap(), e);
        assert_eq!(StoredEntry::decode(&json).unwrap(), e, "plain JSON");
    }

    #[test]
    fn damaged_entries_are_errors_not_panics() {
        assert!(StoredEntry::decode(&[DEFLATED, 0xff, 0x00]).is_err());
        assert!(StoredEntry::decode(&[ZSTD_DICT1, 0xff, 0x00]).is_err());
        assert!(StoredEntry::decode(b"").is_err());
        let mut stored = exec_entry(3).encode().unwrap();
        let n = stored.len();
        stored.truncate(n - 5);
        assert!(StoredEntry::decode(&stored).is_err());
    }

    #[test]
    fn an_entry_that_claims_more_than_the_bound_is_refused_before_inflating() {
        let mut z = zstd::bulk::Compressor::with_dictionary(1, DICT_V1).unwrap();
        let bomb = z.compress(&vec![b' '; (MAX_ENTRY + 1) as usize]).unwrap();
        assert!(bomb.len() < 4096, "{} bytes", bomb.len());
        let mut stored = vec![ZSTD_DICT1];
        stored.extend_from_slice(&bomb);
        assert!(matches!(
            StoredEntry::decode(&stored),
            Err(DecodeError::TooLarge)
        ));
    }

    #[test]
    fn the_dictionary_never_changes() {
        // Entries on disk can only be read with these very bytes.
        assert_eq!(
            hex(&sha256(DICT_V1)),
            "08a0b361d6e9757bf9f189b6b6ff7b7ff5f6b349221427bfd20944a2e19c5ba2",
            "dict-v1.json is part of the stored format: add a new tag for a new dictionary"
        );
    }
}
