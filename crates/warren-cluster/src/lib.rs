//! Warren's cluster layer over etcd: membership, the gateways' view, and placement.
//!
//! - [`member`]: a node registers `<root>/nodes/<id>` under a lease (TTL 3 s, renewed every
//!   second), refuses to share its id with another live node, publishes its load summary
//!   (at most once a second, or on a change over 5%), keeps its lease through an etcd outage,
//!   and registers again by itself once etcd says the lease is gone;
//! - [`view`]: a gateway's one prefix watch and the view it keeps (re-listed after a
//!   compaction, a disconnect or a silent watch, kept as is while etcd is away);
//! - [`place`]: filters and power-of-k choices over a view (pure);
//! - [`drain`]: the drain marks;
//! - [`keys`]: the key layout.
//!
//! etcd holds membership and load only, never per-sandbox keys: it is not on the create or
//! exec path. This crate never speaks HTTP to nodes; the gateway does.

pub mod drain;
pub mod error;
pub mod etcd;
pub mod keys;
pub mod member;
pub mod place;
pub mod view;

pub use error::{ClusterError, IdHeld, JoinError, Result};
pub use keys::Keys;
pub use member::{LeaseClock, MemberConfig, MemberState, Membership, RecordSource, RejoinHook};
pub use place::{candidates, Exclusions, PlaceError, PlaceRequest};
pub use view::{ClusterView, Member, View};
