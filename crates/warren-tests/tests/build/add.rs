//! `ADD` of local files: a tar (plain or gzip) is unpacked at the destination with the
//! archive's owners and modes, a gzip file that holds no tar and any other file are copied
//! as they are, an xz archive is refused with a clear error.

use super::{build, write};
use crate::common::Daemon;
use crate::layers;
use std::io::Write;

fn tar_of(entries: &[(&str, &str, u32, u32)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, body, mode, uid) in entries {
        let mut h = tar::Header::new_ustar();
        if name.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
        } else {
            h.set_size(body.len() as u64);
        }
        h.set_mode(*mode);
        h.set_uid(u64::from(*uid));
        h.set_gid(u64::from(*uid));
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append_data(&mut h, name, body.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_unpacks_local_tars_and_copies_other_files() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("build-add");
    let ctx = t.path();
    write(
        ctx,
        "Dockerfile",
        "FROM default\n\
         ADD tool.tar /opt/\n\
         ADD data.tar.gz /srv/data\n\
         ADD notes.txt.gz plain.txt /srv/files/\n",
    );
    let tool = tar_of(&[
        ("tool/", "", 0o755, 0),
        ("tool/bin/run", "#!/bin/sh\necho ran\n", 0o750, 0),
        ("tool/conf", "owned\n", 0o640, 1234),
    ]);
    std::fs::write(ctx.join("tool.tar"), tool).unwrap();
    let data = tar_of(&[("a.txt", "a\n", 0o644, 0), ("sub/b.txt", "b\n", 0o600, 0)]);
    std::fs::write(ctx.join("data.tar.gz"), gzip(&data)).unwrap();
    let notes = gzip(b"compressed notes, not a tar\n");
    std::fs::write(ctx.join("notes.txt.gz"), &notes).unwrap();
    write(ctx, "plain.txt", "plain\n");
    let tag = format!("{}:1", super::unique("add"));
    let (code, out, err) = build(&d, &[ctx.to_str().unwrap(), "-t", &tag]);
    assert_eq!(code, 0, "build failed: {out}{err}");
    let id = d.create(&super::image(&tag)).await.id;
    let seen = d
        .sh_ok(
            &id,
            "cd / && find opt/tool srv -printf '%p %y %m %U\\n' | sort; /opt/tool/bin/run; \
             cat srv/data/sub/b.txt; zcat srv/files/notes.txt.gz",
        )
        .await;
    assert_eq!(
        seen,
        "opt/tool d 755 0\nopt/tool/bin d 755 0\nopt/tool/bin/run f 750 0\nopt/tool/conf f 640 1234\n\
         srv d 755 0\nsrv/data d 755 0\nsrv/data/a.txt f 644 0\nsrv/data/sub d 755 0\nsrv/data/sub/b.txt f 600 0\n\
         srv/files d 755 0\nsrv/files/notes.txt.gz f 644 0\nsrv/files/plain.txt f 644 0\n\
         ran\nb\ncompressed notes, not a tar\n"
    );
    d.client().delete(&id).await.unwrap();
    d.client().delete_image(&tag).await.unwrap();

    // xz is not read here: refused, naming the file.
    std::fs::write(
        ctx.join("x.tar.xz"),
        [0xfd, b'7', b'z', b'X', b'Z', 0, 0, 4],
    )
    .unwrap();
    write(ctx, "Dockerfile", "FROM default\nADD x.tar.xz /x/\n");
    let (code, _, err) = build(&d, &[ctx.to_str().unwrap(), "-t", &tag]);
    assert_eq!(code, 1);
    assert!(
        err.contains("x.tar.xz") && err.contains("xz and bzip2"),
        "{err}"
    );
}
