//! Lease mode: a claim with a fencing token and a lease, the body run while
//! the runtime's lease keeper ([`keeper`]) extends the lease, then the
//! outcome recorded (or the claim released). [`single`] runs one message,
//! [`batch`] a batch of them.

pub(crate) mod batch;
pub(crate) mod keeper;
pub(crate) mod single;
