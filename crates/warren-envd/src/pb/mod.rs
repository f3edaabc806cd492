//! envd's wire messages, written from its published `process` and `filesystem` protobuf
//! specs: each struct is both a protobuf message (prost) and its protobuf-JSON form (serde,
//! lowerCamelCase names, unknown fields ignored, missing ones default).

pub mod filesystem;
pub mod json;
pub mod process;

use serde::{Deserialize, Serialize};

/// `google.protobuf.Timestamp`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl Timestamp {
    pub fn from_millis(ms: i64) -> Timestamp {
        Timestamp {
            seconds: ms.div_euclid(1000),
            nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
        }
    }
}

/// An empty message (every `...Response {}` and keepalive).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
pub struct Empty {}

/// Defines a [`json::ProtoEnum`] for a prost enumeration from its wire names.
macro_rules! proto_enum {
    ($t:ty { $($v:path => $n:literal),* $(,)? }) => {
        impl $crate::pb::json::ProtoEnum for $t {
            fn name(v: i32) -> Option<&'static str> {
                match <$t>::try_from(v).ok()? { $($v => Some($n),)* }
            }
            fn number(name: &str) -> Option<i32> {
                match name { $($n => Some($v as i32),)* _ => None }
            }
        }
    };
}
pub(crate) use proto_enum;
