//! Test helpers shared by several crates (dev-dependency only; never in a binary). Each
//! checks behaviour that every API server of Warren (a node's, a gateway's) must give alike,
//! so one copy of the check holds them all to it. It depends on no server crate: a server
//! hands it its router and its route table.

pub mod routes;
