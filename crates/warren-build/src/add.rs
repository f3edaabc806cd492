//! `ADD` of a local archive: a context file that is a tar (plain or gzip-compressed) is
//! unpacked at the destination instead of copied. What is an archive is told by the bytes,
//! not the name: a `.tar.gz` that holds no tar is copied as it is, and so is every other
//! file. xz and bzip2 archives are refused with a clear error (this crate reads neither).
//!
//! The archive is unpacked into a scratch directory of the store (as an image layer is:
//! owners, modes and times kept, nothing written outside it, `..` refused); the copy plan
//! then reads that tree like a directory of the context, keeping the archive's owners.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::BuildError;

/// What a file is, for `ADD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Archive {
    Tar,
    Gzip,
}

const TAR_BLOCK: usize = 512;

/// Whether `b` (one 512-byte block) is a tar header: the POSIX magic, or an old-style header
/// whose checksum adds up.
fn is_tar_header(b: &[u8]) -> bool {
    if b.len() < TAR_BLOCK || b.iter().all(|&x| x == 0) {
        return false;
    }
    if &b[257..262] == b"ustar" {
        return true;
    }
    let field = String::from_utf8_lossy(&b[148..156]);
    let Ok(want) = u32::from_str_radix(field.trim_matches(|c: char| c == '\0' || c == ' '), 8)
    else {
        return false;
    };
    let sum: u32 = b[..TAR_BLOCK]
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(x)
            }
        })
        .sum();
    sum == want
}

/// Reads up to one tar block from `r`.
fn first_block(mut r: impl Read) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; TAR_BLOCK];
    let mut n = 0;
    while n < TAR_BLOCK {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    buf.truncate(n);
    Ok(buf)
}

/// How errors name a source: its file name (the node's scratch path means nothing to the
/// caller).
fn shown(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The archive `path` is, if it is one `ADD` unpacks.
pub fn archive_kind(path: &Path) -> Result<Option<Archive>, BuildError> {
    let io = |e| BuildError::io(format!("read {}", path.display()), e);
    let head = first_block(std::fs::File::open(path).map_err(io)?).map_err(io)?;
    let name = shown(path);
    if head.starts_with(&[0x1f, 0x8b]) {
        let f = std::fs::File::open(path).map_err(io)?;
        // A gzip stream that does not decode, or decodes to no tar, is just a file.
        return Ok(first_block(flate2::read::MultiGzDecoder::new(f))
            .ok()
            .filter(|b| is_tar_header(b))
            .map(|_| Archive::Gzip));
    }
    if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) || head.starts_with(b"BZh") {
        return Err(BuildError::Invalid(format!(
            "ADD {name}: xz and bzip2 archives are not unpacked here (tar and gzip are): \
             unpack it in a RUN or recompress it with gzip"
        )));
    }
    Ok(is_tar_header(&head).then_some(Archive::Tar))
}

/// Unpacks archive `path` (of kind `kind`) into `into`, which must not exist yet.
pub fn unpack(path: &Path, kind: Archive, into: &Path) -> Result<(), BuildError> {
    let io = |e| BuildError::io(format!("unpack {}", path.display()), e);
    std::fs::create_dir_all(into).map_err(io)?;
    let f = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let r: Box<dyn Read> = match kind {
        Archive::Tar => Box::new(f),
        Archive::Gzip => Box::new(flate2::read::MultiGzDecoder::new(f)),
    };
    warren_image::import::unpack::unpack(r, into)
        .map(|_| ())
        .map_err(|e| {
            let m = match e {
                warren_image::import::unpack::UnpackError::Bad(m) => m,
                warren_image::import::unpack::UnpackError::Io(e) => e.to_string(),
            };
            BuildError::Invalid(format!("ADD {}: bad archive: {m}", shown(path)))
        })
}

/// A scratch directory removed (with everything in it) when dropped.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, body) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(body.len() as u64);
            h.set_mode(0o640);
            h.set_uid(1000);
            h.set_gid(1000);
            h.set_cksum();
            b.append_data(&mut h, name, *body).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn gzip(b: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn archives_are_told_by_their_bytes() {
        let d = tempfile::tempdir().unwrap();
        let tar = tar_of(&[("a/b.txt", b"hi\n")]);
        let cases: Vec<(&str, Vec<u8>, Option<Archive>)> = vec![
            ("plain.bin", tar.clone(), Some(Archive::Tar)),
            ("x.tar.gz", gzip(&tar), Some(Archive::Gzip)),
            ("notes.gz", gzip(b"just text, no tar"), None),
            ("fake.tar", b"not a tar at all".to_vec(), None),
            ("empty.tar", Vec::new(), None),
            ("zeros.tar", vec![0u8; 1024], None),
        ];
        for (name, bytes, want) in cases {
            let p = d.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            assert_eq!(archive_kind(&p).unwrap(), want, "{name}");
        }
        let p = d.path().join("x.tar.xz");
        std::fs::write(&p, [0xfd, b'7', b'z', b'X', b'Z', 0, 1, 2]).unwrap();
        let e = archive_kind(&p).unwrap_err().to_string();
        assert!(e.contains("xz and bzip2"), "{e}");
    }
}
