//! Transaction mode: the claim, the body's writes and the outcome in one
//! database transaction. [`single`] runs one message, [`batch`] a batch of
//! them.

pub(crate) mod batch;
pub(crate) mod single;
