//! Images a tenant imports are its own: other tenants cannot see them, use them or replace
//! them, and no tenant can replace the node's own images.

use std::io::Write;

use warren_client::{ClientError, CreateSandboxRequest, ErrorCode, ExecRequest};
use warren_types::function::CallRequest;
use warren_types::ImageRef;

use crate::{auth_file, daemon, tcp, TOKEN_A, TOKEN_B, TOKEN_OPS};

/// A `docker save` archive of one layer holding `/opt/team/secret.txt` = `content`.
fn archive(content: &str, repo_tag: &str) -> Vec<u8> {
    use sha2::Digest;
    let tar_of = |entries: &[(&str, &[u8])]| {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_size(data.len() as u64);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    };
    let layer = tar_of(&[("opt/team/secret.txt", content.as_bytes())]);
    let diff = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&layer)));
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [diff]},
    }))
    .unwrap();
    let config_name = format!("{}.json", hex::encode(sha2::Sha256::digest(&config)));
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": config_name, "RepoTags": [repo_tag], "Layers": ["l1/layer.tar"],
    }]))
    .unwrap();
    tar_of(&[
        ("l1/layer.tar", &layer),
        (&config_name, &config),
        ("manifest.json", &manifest),
    ])
}

async fn import(
    c: &warren_client::Client,
    content: &str,
    tag: &str,
    force: bool,
) -> Result<warren_types::ImageImported, ClientError> {
    let bytes = archive(content, "archive-own-name:1");
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&bytes).unwrap();
    let file = tokio::fs::File::open(f.path()).await.unwrap();
    c.import_image(file, Some(tag), force).await
}

/// The error's text with the image's name made neutral.
fn neutral(e: &ClientError, name: &str) -> String {
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    assert_eq!(e.status(), Some(404), "{e}");
    e.to_string().replace(name, "<image>")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_belong_to_the_tenants_that_import_them() {
    let Some((_d, port)) = daemon(&auth_file(""), &[]).await else {
        return;
    };
    let (a, b, ops) = (
        tcp(port, Some(TOKEN_A)),
        tcp(port, Some(TOKEN_B)),
        tcp(port, Some(TOKEN_OPS)),
    );
    // The store is the node's own and outlives the test: a tag of this run alone, removed
    // at the end.
    let own_tag = format!("a-tools-{}:1", std::process::id());
    let own = import(&a, "of team a", &own_tag, false).await.unwrap();
    assert_eq!(own.image.owner.as_deref(), Some("team-a"));

    // Listings: the node's own images for everyone, a tenant's only for it (and admins).
    let names =
        |v: Vec<warren_types::ImageInfo>| v.into_iter().map(|i| i.reference).collect::<Vec<_>>();
    let seen_by_a = names(a.images().await.unwrap());
    let seen_by_b = names(b.images().await.unwrap());
    assert!(seen_by_a.contains(&own_tag), "{seen_by_a:?}");
    assert!(
        seen_by_a.contains(&"default:latest".to_string()),
        "{seen_by_a:?}"
    );
    assert!(!seen_by_b.contains(&own_tag), "{seen_by_b:?}");
    assert!(
        seen_by_b.contains(&"default:latest".to_string()),
        "{seen_by_b:?}"
    );
    assert_eq!(
        ops.image(&own_tag).await.unwrap().owner.as_deref(),
        Some("team-a")
    );

    // Inspecting: exactly the answer a missing image gets.
    assert_eq!(
        neutral(&b.image(&own_tag).await.unwrap_err(), &own_tag),
        neutral(&b.image("zz-missing:1").await.unwrap_err(), "zz-missing:1"),
    );

    // Using: the owner can stack it on the node's image; another tenant is told it is missing.
    let stack = |top: &str| CreateSandboxRequest {
        image: ImageRef::Stack(vec!["default".into(), top.into()]),
        ..Default::default()
    };
    let sb = a.create(&stack(&own_tag)).await.unwrap();
    let out = a
        .exec(&sb.id, &ExecRequest::shell("cat /opt/team/secret.txt"))
        .await
        .unwrap();
    assert_eq!(out.stdout, "of team a", "{out:?}");
    a.delete(&sb.id).await.unwrap();
    assert_eq!(
        neutral(&b.create(&stack(&own_tag)).await.unwrap_err(), &own_tag),
        neutral(
            &b.create(&stack("zz-missing:1")).await.unwrap_err(),
            "zz-missing:1"
        ),
    );
    let call = |img: &str| CallRequest {
        image: ImageRef::Stack(vec!["default".into(), img.into()]),
        ..CallRequest::argv(["cat", "/opt/team/secret.txt"])
    };
    assert_eq!(
        neutral(&b.call(&call(&own_tag)).await.unwrap_err(), &own_tag),
        neutral(
            &b.call(&call("zz-missing:1")).await.unwrap_err(),
            "zz-missing:1"
        ),
    );

    // Replacing: another tenant's tag and the node's own images are refused, even with
    // `force`; a tenant replaces its own (with `force`); an admin may replace anything.
    for force in [false, true] {
        for tag in [own_tag.as_str(), "default", "default:latest"] {
            let e = import(&b, "of team b", tag, force).await.unwrap_err();
            assert_eq!(e.code(), Some(ErrorCode::Conflict), "{tag}: {e}");
            assert_eq!(e.status(), Some(409), "{tag}: {e}");
        }
    }
    assert_eq!(
        ops.image(&own_tag).await.unwrap().owner.as_deref(),
        Some("team-a"),
        "a refused import changed nothing"
    );
    let e = import(&a, "of team a, again", &own_tag, false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    import(&a, "of team a, again", &own_tag, true)
        .await
        .unwrap();
    let by_admin = import(&ops, "of ops", &own_tag, true).await.unwrap();
    assert_eq!(
        by_admin.image.owner, None,
        "an admin's import is the node's own"
    );
    assert!(names(b.images().await.unwrap()).contains(&own_tag));
    ops.delete_image(&own_tag).await.unwrap();
}
