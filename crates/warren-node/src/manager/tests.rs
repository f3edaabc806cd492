//! Manager tests.
