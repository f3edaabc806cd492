//! The trajectory route: a sandbox's log of changing calls, as raw NDJSON or parsed entries.

use futures::{Stream, StreamExt};
use hyper::Method;
use warren_types::TrajectoryEntry;

use crate::client::{empty_body, seg, Client};
use crate::error::ClientError;
use crate::stream::{ndjson, ByteStream};

fn trajectory_path(id: &str, from_seq: Option<u64>) -> String {
    let mut path = format!("/v1/sandboxes/{}/trajectory", seg(id));
    if let Some(s) = from_seq {
        path.push_str(&format!("?from_seq={s}"));
    }
    path
}

impl Client {
    /// `GET /v1/sandboxes/{id}/trajectory`: the log as it comes, one JSON entry per line.
    pub async fn trajectory_raw(
        &self,
        id: &str,
        from_seq: Option<u64>,
    ) -> Result<ByteStream, ClientError> {
        let reply = self
            .send(
                Method::GET,
                &trajectory_path(id, from_seq),
                empty_body(),
                None,
            )
            .await?;
        Ok(reply.into_stream())
    }

    /// The log as parsed entries, streamed.
    pub async fn trajectory_stream(
        &self,
        id: &str,
        from_seq: Option<u64>,
    ) -> Result<impl Stream<Item = Result<TrajectoryEntry, ClientError>> + Send, ClientError> {
        Ok(ndjson(self.trajectory_raw(id, from_seq).await?))
    }

    /// The whole log in memory.
    pub async fn trajectory(
        &self,
        id: &str,
        from_seq: Option<u64>,
    ) -> Result<Vec<TrajectoryEntry>, ClientError> {
        let mut s = Box::pin(self.trajectory_stream(id, from_seq).await?);
        let mut out = Vec::new();
        while let Some(e) = s.next().await {
            out.push(e?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn paths() {
        assert_eq!(
            super::trajectory_path("n1-x", Some(3)),
            "/v1/sandboxes/n1-x/trajectory?from_seq=3"
        );
        assert_eq!(
            super::trajectory_path("n1-x", None),
            "/v1/sandboxes/n1-x/trajectory"
        );
    }
}
