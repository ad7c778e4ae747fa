//! Lease mode on the in-memory store: the lease suite (`common/lease.rs`),
//! each test on a store of its own; the bodies' effects are counted next to
//! it.

mod common;

common::lease::suite!(common::MemoryFx);
common::lease::clock_suite!(common::MemoryFx);
