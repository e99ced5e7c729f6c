//! Errors returned by the core. Each variant maps to one Python exception class
//! (`tokenyard.errors`), and every message names the argument and the value received.

use std::fmt::Display;

/// Everything that can go wrong when calling the core with bad configuration or input.
///
/// A failed call leaves the structure it was called on unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A constructor or configuration value is out of range. One message form across the
    /// package: `<key>: <reason>, got <value>`.
    #[error("{field}: {reason}, got {value}")]
    Config {
        field: &'static str,
        value: String,
        reason: String,
    },
    /// An argument of an operation is invalid for the structure's current state.
    #[error("invalid argument {arg}={value}: {reason}")]
    Input {
        arg: &'static str,
        value: String,
        reason: String,
    },
    /// A request no replica will ever serve (longer than the deployment's limit); the
    /// message names the request, its lengths and the limiting setting.
    #[error("{reason}")]
    Rejected { request: u64, reason: String },
    /// The request id is not known to the structure (never added, or already freed).
    #[error("unknown request_id={0}")]
    UnknownRequest(String),
    /// A policy plugin failed or returned an invalid answer.
    #[error("policy plugin: {0}")]
    Plugin(String),
    /// An internal invariant broke: a bug in tokenyard, not in its input or a plugin.
    #[error("internal error (a bug in tokenyard): {0}")]
    Internal(String),
    /// A KV connector (`sched::KvConnector`) failed in `method` or returned an invalid
    /// answer (`value`).
    #[error("KV connector {method}(): {reason}, got {value}")]
    Connector {
        method: &'static str,
        value: String,
        reason: String,
    },
    /// A simulation stopped with requests no replica will ever run (the message names the
    /// first one).
    #[error("{0}")]
    Stalled(String),
    /// The structure does not have room for what was asked.
    #[error("not enough capacity for {what}: requested {requested}, available {available}")]
    Capacity {
        what: &'static str,
        requested: usize,
        available: usize,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn config(field: &'static str, value: impl Display, reason: impl Into<String>) -> Self {
        Error::Config {
            field,
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub fn input(arg: &'static str, value: impl Display, reason: impl Into<String>) -> Self {
        Error::Input {
            arg,
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub fn connector(method: &'static str, value: impl Display, reason: impl Into<String>) -> Self {
        Error::Connector {
            method,
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub fn unknown_request(request_id: &impl std::fmt::Debug) -> Self {
        Error::UnknownRequest(format!("{request_id:?}"))
    }
}
