//! Errors as HTTP answers: the API's one error type ([`warren_types::http::HttpError`]), made
//! from a [`NodeError`] by its stable code.

pub use warren_types::http::{HttpError, HttpResult};

use crate::error::NodeError;

impl From<NodeError> for HttpError {
    fn from(e: NodeError) -> Self {
        e.to_api().into()
    }
}
