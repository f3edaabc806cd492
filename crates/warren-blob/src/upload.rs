//! Storing a blob from a file without holding it whole: the file is read and sent a part
//! at a time ([`BlobStore::put_parts`]; an S3 multipart upload, or a temporary file renamed
//! into place in a local store), so the memory an upload takes is one part, however large
//! the file is. A file shorter than a part is sent with one `put`.

use bytes::Bytes;
use std::io::Read;

use crate::{BlobError, BlobStore, BlobUpload};

/// Bytes of one part: at least S3's least part (5 MiB), and the most an upload holds.
pub const PART_BYTES: usize = 8 << 20;

/// Reads up to `limit` bytes of `file` from where it is (fewer only at its end), off the
/// async threads.
async fn read_part(
    file: std::fs::File,
    limit: usize,
) -> Result<(std::fs::File, Vec<u8>), BlobError> {
    tokio::task::spawn_blocking(move || {
        let mut buf = Vec::with_capacity(limit);
        (&file).take(limit as u64).read_to_end(&mut buf)?;
        Ok::<_, std::io::Error>((file, buf))
    })
    .await
    .map_err(|e| BlobError::io("reading a part", std::io::Error::other(e)))?
    .map_err(|e| BlobError::io("reading a part", e))
}

/// Stores the rest of `file` (from where it is) under `key` in `store`, a part of at most
/// [`PART_BYTES`] at a time; answers the bytes stored. A failure aborts the upload: the key
/// is left as it was.
pub async fn put_file(
    store: &dyn BlobStore,
    key: &str,
    file: std::fs::File,
) -> Result<u64, BlobError> {
    let (file, first) = read_part(file, PART_BYTES).await?;
    if first.len() < PART_BYTES {
        let n = first.len() as u64;
        store.put(key, Bytes::from(first)).await?;
        return Ok(n);
    }
    let mut upload = store.put_parts(key).await?;
    let sent = send_parts(upload.as_mut(), file, first).await;
    match sent {
        Ok(n) => upload.complete().await.map(|_| n),
        Err(e) => {
            if let Err(a) = upload.abort().await {
                tracing::warn!(key, error = %a, "cannot abort a blob upload");
            }
            Err(e)
        }
    }
}

/// Sends `first`, then the rest of `file`, part by part; answers the bytes sent.
async fn send_parts(
    upload: &mut dyn BlobUpload,
    mut file: std::fs::File,
    first: Vec<u8>,
) -> Result<u64, BlobError> {
    let mut sent = 0u64;
    let mut part = first;
    loop {
        if part.is_empty() {
            return Ok(sent);
        }
        let last = part.len() < PART_BYTES;
        sent += part.len() as u64;
        upload.put_part(Bytes::from(part)).await?;
        if last {
            return Ok(sent);
        }
        (file, part) = read_part(file, PART_BYTES).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalStore;

    /// Publishing a layer larger than a part hands the store one part at a time (the
    /// whole layer at once before), and the store holds it whole under its digest.
    #[tokio::test]
    async fn a_layer_is_published_a_part_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::LargestHanded::new(LocalStore::new(dir.path().join("store")));
        let src = data(PART_BYTES * 2 + 100);
        let f = dir.path().join("layer");
        std::fs::write(&f, &src).unwrap();
        let t = crate::publish_layer(&store, &f, crate::DEFAULT_CHUNK_SIZE)
            .await
            .unwrap();
        let hex = crate::hex_of(&t.digest).unwrap();
        assert!(store.get(&crate::blob_key(hex)).await.unwrap() == src);
        let most = store.most();
        assert!(
            most <= PART_BYTES,
            "the store was handed {most} bytes at once"
        );
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 7) as u8).collect()
    }

    /// Files of a part or less (one `put`), exactly two parts, and parts and a tail all
    /// arrive whole; a failed upload leaves no blob and no temporary file.
    #[tokio::test]
    async fn a_file_is_stored_part_by_part() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().join("store"));
        for (i, len) in [0, 10, PART_BYTES, 2 * PART_BYTES, 2 * PART_BYTES + 12_345]
            .into_iter()
            .enumerate()
        {
            let src = data(len);
            let f = dir.path().join(format!("src{i}"));
            std::fs::write(&f, &src).unwrap();
            let key = format!("blobs/{i}");
            let n = put_file(&store, &key, std::fs::File::open(&f).unwrap())
                .await
                .unwrap();
            assert_eq!(n, len as u64);
            assert_eq!(store.get(&key).await.unwrap(), src, "length {len}");
        }
        assert_eq!(store.list("blobs/").await.unwrap().len(), 5);
        let mut upload = store.put_parts("blobs/aborted").await.unwrap();
        upload.put_part(Bytes::from(data(100))).await.unwrap();
        upload.abort().await.unwrap();
        let dropped = {
            let mut u = store.put_parts("blobs/dropped").await.unwrap();
            u.put_part(Bytes::from(data(100))).await.unwrap();
            u
        };
        drop(dropped);
        let left: Vec<_> = std::fs::read_dir(dir.path().join("store/blobs"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left.len(), 5, "{left:?}");
    }
}
