use super::pack::header_blocks;
use super::unpack::{State, Unpacker};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use warren_proto::Event;
use warren_types::ErrorCode;

fn unpacker(dest: &Path) -> Unpacker {
    Unpacker {
        dest: dest.to_path_buf(),
        block: Vec::new(),
        state: State::Header,
        long_name: None,
        long_link: None,
        dirs: Vec::new(),
    }
}

fn entry(
    b: &mut tar::Builder<Vec<u8>>,
    name: &str,
    kind: tar::EntryType,
    data: &[u8],
    link: Option<&str>,
) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(if kind == tar::EntryType::Directory {
        0o750
    } else {
        0o640
    });
    h.set_mtime(1_000_000);
    // Raw names: the builder's own checks would refuse the hostile ones.
    let n = name.len().min(100);
    h.as_old_mut().name[..n].copy_from_slice(&name.as_bytes()[..n]);
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    h.set_cksum();
    b.append(&h, data).unwrap();
}

fn unpack(dest: &Path, tar: &[u8], chunk: usize) -> Event {
    let mut u = unpacker(dest);
    for c in tar.chunks(chunk) {
        if let Err(e) = u.feed(c) {
            return e;
        }
    }
    u.end()
}

#[test]
fn unpacks_files_dirs_symlinks_with_modes_and_mtimes_in_any_chunking() {
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "d/", tar::EntryType::Directory, b"", None);
    entry(&mut b, "d/f", tar::EntryType::Regular, &[7u8; 1500], None);
    entry(&mut b, "d/l", tar::EntryType::Symlink, b"", Some("f"));
    let long = format!("d/{}", "x".repeat(150));
    let mut h = tar::Header::new_gnu();
    h.set_size(2);
    h.set_mode(0o755);
    b.append_data(&mut h, &long, &b"hi"[..]).unwrap();
    let tar = b.into_inner().unwrap();
    for chunk in [1, 511, 512, 4096, 1 << 20] {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(unpack(t.path(), &tar, chunk), Event::Done, "chunk {chunk}");
        let f = t.path().join("d/f");
        assert_eq!(std::fs::read(&f).unwrap(), vec![7u8; 1500]);
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!((md.mode() & 0o7777, md.mtime()), (0o640, 1_000_000));
        assert_eq!(
            std::fs::read_link(t.path().join("d/l")).unwrap(),
            Path::new("f")
        );
        assert_eq!(std::fs::read(t.path().join(&long)).unwrap(), b"hi");
        let dmd = std::fs::metadata(t.path().join("d")).unwrap();
        assert_eq!((dmd.mode() & 0o7777, dmd.mtime()), (0o750, 1_000_000));
    }
}

#[test]
fn traversal_and_symlink_escapes_are_refused() {
    let outside = tempfile::tempdir().unwrap();
    let cases: Vec<Vec<u8>> = vec![
        {
            let mut b = tar::Builder::new(Vec::new());
            entry(&mut b, "../escape", tar::EntryType::Regular, b"x", None);
            b.into_inner().unwrap()
        },
        {
            let mut b = tar::Builder::new(Vec::new());
            entry(&mut b, "/abs", tar::EntryType::Regular, b"x", None);
            b.into_inner().unwrap()
        },
        {
            // A symlink to outside, then a file through it.
            let mut b = tar::Builder::new(Vec::new());
            let out = outside.path().to_str().unwrap().to_string();
            entry(&mut b, "link", tar::EntryType::Symlink, b"", Some(&out));
            entry(&mut b, "link/owned", tar::EntryType::Regular, b"x", None);
            b.into_inner().unwrap()
        },
        {
            let mut b = tar::Builder::new(Vec::new());
            entry(
                &mut b,
                "h",
                tar::EntryType::Link,
                b"",
                Some("../../etc/passwd"),
            );
            b.into_inner().unwrap()
        },
    ];
    for tar in cases {
        let t = tempfile::tempdir().unwrap();
        let ev = unpack(t.path(), &tar, 512);
        assert!(
            matches!(&ev, Event::Error { code, .. } if *code == ErrorCode::InvalidPath),
            "{ev:?}"
        );
    }
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn a_cut_stream_or_junk_is_an_error() {
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "f", tar::EntryType::Regular, &[1u8; 2000], None);
    let tar = b.into_inner().unwrap();
    let t = tempfile::tempdir().unwrap();
    let ev = unpack(t.path(), &tar[..1200], 100);
    assert!(matches!(ev, Event::Error { .. }), "{ev:?}");
    let t = tempfile::tempdir().unwrap();
    let ev = unpack(t.path(), &[b'j'; 1024], 100);
    assert!(matches!(ev, Event::Error { .. }), "{ev:?}");
}

#[test]
fn packed_headers_read_back_with_the_tar_crate() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("f");
    std::fs::write(&p, b"x").unwrap();
    let md = std::fs::symlink_metadata(&p).unwrap();
    let long = "n".repeat(120);
    let link = "l".repeat(130);
    let mut bytes = header_blocks(
        &long,
        &md,
        tar::EntryType::Symlink,
        0,
        Some(link.as_bytes()),
    );
    bytes.extend_from_slice(&[0u8; 1024]);
    let mut a = tar::Archive::new(&bytes[..]);
    let e = a.entries().unwrap().next().unwrap().unwrap();
    assert_eq!(e.path().unwrap().to_str().unwrap(), long);
    assert_eq!(e.link_name().unwrap().unwrap().to_str().unwrap(), link);
}
