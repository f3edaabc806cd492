//! The layer store.
//!
//! A **layer** is an immutable EROFS image named by the sha256 of its bytes, with metadata
//! (size, source, creation time, media type, the diff id of the OCI layer it was converted
//! from). An **image** is a named, tagged, ordered stack of layers (lowest first), possibly
//! made of other images. Sandboxes compose stacks at start; no layer is ever copied or
//! unpacked per sandbox.
//!
//! On disk, under the store root:
//! ```text
//! blobs/sha256/<hex>          the EROFS image of a layer (never modified)
//! layers/<hex>.json           its metadata (synthesized from the blob when missing)
//! images/<name>/<tag>.json    an image: {"layers": ["sha256:<hex>", ...], "stack": [...], ...}
//! index/<hex>                 OCI layer digest or diff id → the layer it was converted to
//! build-cache/<hex>         a build step's key → the layer it made (see `cache`)
//! leases/<holder>.json        layers a live sandbox, fork or import holds (never collected)
//! mnt/<hex>                   the layer mounted read-only (shared by every sandbox)
//! mnt/<hex>.idmap-<base>      the same, idmapped for sandboxes whose root is host uid <base>
//! mnt/.users                  held shared by every daemon of the store (see `users`)
//! gc.lock                     shared by lease/add, exclusive while collecting
//! ```
//! The store may be shared by several daemons on one host; mounts are made under a file lock.
//! This crate never mounts anything per sandbox. The last daemon to stop with no sandbox left
//! on the store takes its mounts down (`users`).
//!
//! Garbage collection (`gc`) unmounts and deletes every layer that no image and no lease
//! references. A sandbox's lease is written (under the shared lock, together with resolving
//! its refs) before its layers are mounted and removed when it is destroyed, so a collection
//! never removes a layer in use; releasing a lease collects the layers it held that nothing
//! else references (fork snapshots, layers of images removed while in use).

mod cache;
mod error;
mod fetch;
mod files;
mod gc;
pub mod import;
mod layer;
mod lease;
mod store;
mod users;

pub use error::ImageError;
pub use fetch::{LayerPins, LayerSource, SourceStats};
pub use gc::is_temp_holder;
pub use import::{ImportReport, ImportSource};
pub use lease::Lease;
pub use store::{ImageManifest, ImageStore};
pub use users::{MountRelease, StoreUser};
pub use warren_types::{GcReport, ImageDeleted, ImageInfo, LayerInfo};
