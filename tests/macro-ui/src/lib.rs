//! Compile-time behaviour of `#[idempotent]`; see `tests/ui.rs`.
