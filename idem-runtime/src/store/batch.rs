//! What a store sees of a batch handler's call: the messages' keys, the
//! claims it holds, and what a transaction-mode batch found and committed.
//!
//! A batch handler takes a slice of messages; the runtime derives each
//! message's key, drops the repeats of a key within the batch (the second
//! is a duplicate of the first), and hands the store the distinct keys at
//! once: [`LeaseStore::claim_batch`](crate::store::LeaseStore::claim_batch) and
//! [`TxStore::begin_batch`](crate::store::TxStore::begin_batch) answer for each key
//! in the order given. Every method has a default for a store of your own;
//! the stores of this crate override them with one statement (SQL) or one
//! pipelined round trip (Redis) per batch.

use crate::key::Key;
use crate::store::contract::Standing;

/// One message of a batch, as a store sees it: its key and, when the
/// handler declares one, its payload fingerprint. The keys of one batch are
/// distinct.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::BatchItem;
/// use idem_runtime::Key;
///
/// let key = Key::from_parts(&[&"order-7", &"sku-1"])?;
/// let item = BatchItem { key: &key, fingerprint: None };
/// assert_eq!(item.key.as_str(), key.as_str());
/// # Ok::<(), idem_runtime::KeyMissing>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchItem<'a> {
    /// The message's key.
    pub key: &'a Key,
    /// The message's payload fingerprint, if the handler declares one.
    pub fingerprint: Option<&'a str>,
}

/// A claim a lease-mode batch holds: a key and its fencing token.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::Held;
/// use idem_runtime::Key;
///
/// let key = Key::from_parts(&[&"m-1"])?;
/// let held = Held { key: &key, token: "5f0c1e" };
/// assert_eq!(held.token, "5f0c1e");
/// # Ok::<(), idem_runtime::KeyMissing>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held<'a> {
    /// The claimed key.
    pub key: &'a Key,
    /// The claim's fencing token.
    pub token: &'a str,
}

/// What [`TxStore::begin_batch`](crate::store::TxStore::begin_batch) found: the open
/// transaction, and for each key in the order given, `None` when the
/// message is fresh (the body is to run it) or what stands against it.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::{Standing, TxBatch};
///
/// let found: TxBatch<()> = TxBatch {
///     tx: (),
///     standings: vec![None, Some(Standing::Completed { outcome: "7".into(), trace: None })],
/// };
/// let fresh = found.standings.iter().filter(|s| s.is_none()).count();
/// assert_eq!(fresh, 1);
/// ```
#[derive(Debug)]
pub struct TxBatch<Tx> {
    /// The transaction the body runs in.
    pub tx: Tx,
    /// Per key, in the order given: `None` fresh, or the record that stands.
    pub standings: Vec<Option<Standing>>,
}

/// What became of a transaction-mode batch at its commit.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::TxBatchCommit;
///
/// fn next_step(commit: TxBatchCommit) -> &'static str {
///     match commit {
///         TxBatchCommit::Committed => "every fresh message is recorded with the body's writes",
///         TxBatchCommit::Lost => "rolled back: read the batch again and run what is still fresh",
///     }
/// }
/// assert!(next_step(TxBatchCommit::Lost).starts_with("rolled back"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxBatchCommit {
    /// The claims, the body's writes and every outcome committed together.
    Committed,
    /// Another delivery recorded one of the keys between the batch's begin
    /// and its commit: everything was rolled back, and the runtime begins
    /// the batch again (the key is now a duplicate).
    Lost,
}
