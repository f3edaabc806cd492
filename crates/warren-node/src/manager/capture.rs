//! Capture: a sandbox's writable layer packed into a layer of the image store (what an image
//! build's `RUN` step keeps), served by the [`Files`] part. The sandbox is left as it was;
//! the runtime does the packing.

use warren_types::{ApiError, ErrorCode, SandboxId};

use super::{ActivityGuard, Files};
use crate::error::NodeError;

impl Files {
    /// Packs what sandbox `id`'s commands changed into a layer of the store, leaving out
    /// `exclude` (paths relative to its root); returns the layer and the temporary lease that
    /// holds it until the caller references it.
    pub async fn capture_layer(
        &self,
        id: &SandboxId,
        exclude: &[String],
        source: &str,
    ) -> Result<(String, warren_image::Lease), NodeError> {
        let sb = self.sandboxes.lookup(id)?;
        let _busy = ActivityGuard::new(sb.clone());
        // No pause, resume, fork or delete of the sandbox meanwhile.
        let _lifecycle = sb.lifecycle.lock().await;
        let (instance, _) = sb.live_instance()?;
        sb.runtime
            .capture_layer(&instance, exclude, source)
            .await
            .map_err(|e| match e {
                warren_runtime::RuntimeError::Unsupported(why) => {
                    NodeError::Api(ApiError::new(ErrorCode::InvalidState, why.to_string()))
                }
                e => NodeError::runtime(id, e),
            })
    }
}
