//! The relay: publishes the rows of an outbox table to a [`Destination`]
//! and deletes those the broker confirmed.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::Instrument as _;

use super::{Backlog, Outgoing, metrics};
use crate::error::{BoxError, StoreError};
use crate::store::sql::{Dialect, OutboxTable};

/// Where a relay publishes: a broker, or anything else that can take a
/// message and say when it has it. The crate has one per broker
/// ([`KafkaDestination`](super::KafkaDestination),
/// [`RabbitMqDestination`](super::RabbitMqDestination),
/// [`NatsDestination`](super::NatsDestination), behind their features).
///
/// [`publish`](Self::publish) returns once the destination has the
/// message for good (the broker's acknowledgement or publisher confirm):
/// the relay deletes the row only then. It may be called again with a
/// message it already took (a relay that crashed before the delete): it
/// should hand the destination the same [`id`](Outgoing::id), so that the
/// destination or the consumer after it can drop the repeat.
///
/// # Examples
///
/// A destination of your own: a webhook, here a list in memory.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use idem_runtime::BoxError;
/// use idem_runtime::outbox::{Destination, Outgoing};
///
/// #[derive(Default, Clone)]
/// struct Hooks(Arc<Mutex<Vec<String>>>);
///
/// impl Destination for Hooks {
///     fn kind(&self) -> &'static str {
///         "webhook"
///     }
///
///     async fn publish(&self, message: &Outgoing) -> Result<(), BoxError> {
///         self.0.lock().unwrap().push(message.id.to_string());
///         Ok(())
///     }
/// }
/// ```
pub trait Destination: Send + Sync + 'static {
    /// The kind of destination, for the `destination` label of the
    /// metrics: `kafka`, `rabbitmq`, `nats`, or your own.
    fn kind(&self) -> &'static str;

    /// Publishes `message`, resolving once the destination confirmed it.
    fn publish(&self, message: &Outgoing) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// Wakes the relays of this process when a transaction that staged rows
/// commits.
static WAKE: LazyLock<Notify> = LazyLock::new(Notify::new);

/// Rows were committed: the relays of this process take them now rather
/// than at their next poll.
pub(crate) fn wake() {
    WAKE.notify_waiters();
}

/// What one pass of a relay did.
///
/// # Examples
///
/// See [`Relay`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pass {
    /// Messages the destination confirmed, whose rows are gone.
    pub published: usize,
    /// Messages whose publish failed or timed out: their rows stay, with
    /// one more attempt counted.
    pub failed: usize,
    /// Rows left alone because their last publish failed and their next
    /// attempt is not due yet (their lanes wait behind them).
    pub waiting: usize,
}

/// Publishes the rows of an [`OutboxTable`] to a [`Destination`], and
/// deletes each row once the destination confirmed it.
///
/// * **When.** Right after a transaction that staged rows commits in this
///   process (a handler's outcome, [`Outbox::commit`](super::Outbox::commit)),
///   and every poll interval (default 1 s) for rows that other processes
///   committed or a crash left behind.
/// * **Order.** A relay publishes only a row that heads its lane (no
///   earlier row of the lane is left), so the rows of one lane go out one
///   at a time, in the order they were staged. Rows of different lanes go
///   out concurrently, up to the batch size (default 64) per pass.
/// * **Several relays** (in one process or many) share the work: on
///   PostgreSQL and MySQL/MariaDB a relay holds the rows it publishes
///   locked (`FOR UPDATE SKIP LOCKED`) until it deletes them, and the
///   others skip them. SQLite has one writer and no row locks: run one
///   relay per database file (a second one may publish a row the first is
///   publishing, with the same id).
/// * **Failures.** A publish that fails or times out (default 10 s)
///   leaves its row and counts the attempt and the error in it; the row is
///   tried again after a back-off of its own (100 ms, doubling with each
///   failure up to 30 s), and its lane waits behind it while the other
///   lanes go on. A pass that fails on the database backs the whole relay
///   off the same way. Handlers never wait for a relay.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::{Arc, Mutex};
/// use idem_runtime::outbox::{Destination, Message, Outgoing, Relay};
/// use idem_runtime::{BoxError, SqliteStore};
///
/// #[derive(Default, Clone)]
/// struct Seen(Arc<Mutex<Vec<String>>>);
/// impl Destination for Seen {
///     fn kind(&self) -> &'static str { "memory" }
///     async fn publish(&self, m: &Outgoing) -> Result<(), BoxError> {
///         self.0.lock().unwrap().push(m.destination.clone());
///         Ok(())
///     }
/// }
///
/// let store = SqliteStore::connect("sqlite::memory:").await?;
/// store.migrate().await?;
/// let mut tx = store.pool().begin().await?;
/// let mut outbox = store.outbox("place_order", "A-17");
/// outbox.stage(&mut tx, Message::new("orders", "{}")).await?;
/// outbox.commit(tx).await?;
///
/// let seen = Seen::default();
/// let relay = Relay::new(store.outbox_table(), seen.clone());
/// let pass = relay.pass().await?;
/// assert_eq!(pass.published, 1);
/// assert_eq!(*seen.0.lock().unwrap(), ["orders"]);
/// assert_eq!(store.outbox_table().backlog().await?.rows, 0);
/// # Ok(()) }
/// ```
pub struct Relay<D: Dialect, T: Destination> {
    table: OutboxTable<D>,
    to: Arc<T>,
    batch: u32,
    /// Passes under way at once, in `run`.
    passes: usize,
    poll: Duration,
    timeout: Duration,
    /// Rows whose publish failed, by `seq`: when their next attempt is due.
    held: Mutex<HashMap<i64, Instant>>,
}

impl<D: Dialect, T: Destination> std::fmt::Debug for Relay<D, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("table", &self.table.name())
            .field("destination", &self.to.kind())
            .field("batch", &self.batch)
            .field("poll", &self.poll)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The first back-off after a failed pass; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest back-off.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often a running relay reads its table's backlog for the gauges.
const BACKLOG_EVERY: Duration = Duration::from_secs(1);
/// The longest error text a row keeps.
const MAX_ERROR_LEN: usize = 1000;

impl<D: Dialect, T: Destination> Relay<D, T> {
    /// A relay from `table` to `to`, with the defaults: 64 rows a pass, a
    /// poll every second, 10 s for a publish.
    ///
    /// # Examples
    ///
    /// See [`Relay`].
    pub fn new(table: OutboxTable<D>, to: T) -> Relay<D, T> {
        Relay {
            table,
            to: Arc::new(to),
            batch: 64,
            passes: 1,
            poll: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            held: Mutex::new(HashMap::new()),
        }
    }

    /// At most `batch` rows a pass (at least 1): at most that many
    /// publishes wait on the destination at once.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # #[derive(Clone)] struct Nowhere;
    /// # impl idem_runtime::outbox::Destination for Nowhere {
    /// #     fn kind(&self) -> &'static str { "nowhere" }
    /// #     async fn publish(&self, _: &idem_runtime::outbox::Outgoing) -> Result<(), idem_runtime::BoxError> { Ok(()) }
    /// # }
    /// use std::time::Duration;
    /// use idem_runtime::outbox::Relay;
    ///
    /// let store = idem_runtime::SqliteStore::connect("sqlite::memory:").await?;
    /// let relay = Relay::new(store.outbox_table(), Nowhere)
    ///     .with_batch(256)
    ///     .with_poll(Duration::from_millis(250))
    ///     .with_timeout(Duration::from_secs(5));
    /// # let _ = relay;
    /// # Ok(()) }
    /// ```
    pub fn with_batch(mut self, batch: u32) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// How often the relay looks for rows no commit of this process woke
    /// it for (other processes', a crashed relay's).
    ///
    /// # Examples
    ///
    /// See [`with_batch`](Self::with_batch).
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// How long a publish may take before it counts as failed.
    ///
    /// # Examples
    ///
    /// See [`with_batch`](Self::with_batch).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many passes [`run`](Self::run) keeps under way at once (at
    /// least 1; default 1): while one waits on the broker, another reads
    /// and deletes its rows, so the database's round trips overlap the
    /// publishes. Each pass takes rows of its own (`SKIP LOCKED`), and the
    /// rows of a lane still go out one at a time, in order. On SQLite,
    /// where a relay cannot lock rows, it stays 1.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # #[derive(Clone)] struct Nowhere;
    /// # impl idem_runtime::outbox::Destination for Nowhere {
    /// #     fn kind(&self) -> &'static str { "nowhere" }
    /// #     async fn publish(&self, _: &idem_runtime::outbox::Outgoing) -> Result<(), idem_runtime::BoxError> { Ok(()) }
    /// # }
    /// let store = idem_runtime::SqliteStore::connect("sqlite::memory:").await?;
    /// // 4 passes of 16: 64 publishes in flight, as one pass of 64 has
    /// let relay = idem_runtime::outbox::Relay::new(store.outbox_table(), Nowhere)
    ///     .with_batch(16)
    ///     .with_passes(4);
    /// # let _ = relay;
    /// # Ok(()) }
    /// ```
    pub fn with_passes(mut self, passes: usize) -> Self {
        self.passes = if D::OUTBOX_HOLDS { passes.max(1) } else { 1 };
        self
    }

    /// One pass: takes the rows that head their lanes (at most the batch),
    /// publishes them concurrently, deletes those the destination
    /// confirmed and counts a failed attempt in the others.
    ///
    /// # Errors
    ///
    /// The database's, as [`StoreError::Backend`]. Rows published before
    /// an error that kept them from being deleted are published again by
    /// the next pass, with the same ids.
    ///
    /// # Examples
    ///
    /// See [`Relay`].
    pub async fn pass(&self) -> Result<Pass, StoreError> {
        // Rows waiting for their next attempt are not taken, so that as
        // many of them as the batch cannot keep other lanes' rows out.
        let now = Instant::now();
        let waiting: Vec<i64> = {
            let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            held.iter()
                .filter(|(_, at)| **at > now)
                .map(|(seq, _)| *seq)
                .collect()
        };
        let taken = self
            .table
            .take(self.batch, &waiting)
            .await
            .map_err(StoreError::backend)?;
        if taken.rows.is_empty() {
            return Ok(Pass::default());
        }
        let results =
            futures_util::future::join_all(taken.rows.iter().map(|row| self.publish(row))).await;
        let mut sent = Vec::with_capacity(results.len());
        let mut failed = Vec::new();
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            for (row, result) in taken.rows.iter().zip(results) {
                match result {
                    Ok(()) => {
                        held.remove(&row.seq);
                        sent.push(row.seq);
                    }
                    Err(e) => {
                        let wait = backoff(row.attempts.saturating_add(1));
                        held.insert(row.seq, Instant::now() + wait);
                        failed.push((row.seq, e));
                    }
                }
            }
            // Rows gone meanwhile (another relay's, an operator's delete).
            held.retain(|_, at| now.saturating_duration_since(*at) < Duration::from_secs(60));
        }
        let pass = Pass {
            published: sent.len(),
            failed: failed.len(),
            waiting: waiting.len(),
        };
        self.table
            .settle(taken, &sent, &failed)
            .await
            .map_err(StoreError::backend)?;
        let kind = self.to.kind();
        if pass.published > 0 {
            metrics::published(self.table.name(), kind, pass.published);
        }
        if pass.failed > 0 {
            metrics::failed(self.table.name(), kind, pass.failed);
        }
        Ok(pass)
    }

    /// Publishes one row, in its span, within the timeout: the error's
    /// text when it fails.
    async fn publish(&self, row: &Outgoing) -> Result<(), String> {
        let span = tracing::info_span!(
            "idem.outbox.publish",
            id = %row.id,
            destination = %row.destination,
            producer = %row.handler,
            attempts = row.attempts,
        );
        let done = tokio::time::timeout(self.timeout, self.to.publish(row))
            .instrument(span.clone())
            .await;
        let error = match done {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no confirmation within {:?}", self.timeout),
        };
        span.in_scope(|| tracing::warn!(error = %error, "outbox publish failed; the row stays"));
        let mut error = error;
        if error.len() > MAX_ERROR_LEN {
            let mut cut = MAX_ERROR_LEN;
            while !error.is_char_boundary(cut) {
                cut -= 1;
            }
            error.truncate(cut);
        }
        Err(error)
    }

    /// Runs passes until `until` resolves: at once after a commit of this
    /// process that staged rows, every poll interval otherwise, and again
    /// at once after a pass that published anything; after a pass that
    /// failed, after a back-off. A pass under way when `until` resolves
    /// ends first.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # #[derive(Clone)] struct Nowhere;
    /// # impl idem_runtime::outbox::Destination for Nowhere {
    /// #     fn kind(&self) -> &'static str { "nowhere" }
    /// #     async fn publish(&self, _: &idem_runtime::outbox::Outgoing) -> Result<(), idem_runtime::BoxError> { Ok(()) }
    /// # }
    /// use idem_runtime::outbox::Relay;
    ///
    /// let store = idem_runtime::SqliteStore::connect("sqlite::memory:").await?;
    /// store.migrate().await?;
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let relay = tokio::spawn(Relay::new(store.outbox_table(), Nowhere).run(async {
    ///     let _ = stopped.await;
    /// }));
    /// // ... the application runs ...
    /// stop.send(()).ok();
    /// relay.await?;
    /// # Ok(()) }
    /// ```
    pub async fn run(self, until: impl Future<Output = ()>) {
        let stop = tokio::sync::watch::channel(false);
        let passes = (0..self.passes).map(|n| self.passes_loop(n == 0, stop.1.clone()));
        let all = futures_util::future::join_all(passes);
        tokio::pin!(all);
        tokio::select! {
            () = until => {
                stop.0.send_replace(true);
                all.await;
            }
            _ = &mut all => {}
        }
    }

    /// One loop of passes, until `stop` turns true (a pass under way ends
    /// first); the first loop also reads the backlog for the gauges.
    async fn passes_loop(&self, gauges: bool, mut stop: tokio::sync::watch::Receiver<bool>) {
        // Passes failed on the database in a row.
        let mut failures: u32 = 0;
        let mut backlog_read: Option<Instant> = None;
        loop {
            if *stop.borrow() {
                return;
            }
            let woken = WAKE.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let wait = match self.pass().await {
                Ok(pass) if pass.published > 0 => {
                    failures = 0;
                    Duration::ZERO
                }
                Ok(_) => {
                    // Nothing went out: wait for a commit, the poll, or the
                    // next failed row's attempt, whichever comes first.
                    failures = 0;
                    self.poll.min(self.next_attempt())
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let wait = backoff(failures);
                    tracing::warn!(table = self.table.name(), error = %e, "outbox relay pass failed; trying again in {wait:?}");
                    wait
                }
            };
            if gauges && backlog_read.is_none_or(|at| at.elapsed() >= BACKLOG_EVERY) {
                backlog_read = Some(Instant::now());
                if let Ok(Backlog { rows, oldest_age }) = self.table.backlog().await {
                    metrics::backlog(self.table.name(), rows, oldest_age);
                }
            }
            let failing = failures > 0;
            tokio::select! {
                biased;
                _ = stop.wait_for(|stopped| *stopped) => return,
                () = &mut woken, if !failing => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

impl<D: Dialect, T: Destination> Relay<D, T> {
    /// How long until the next failed row's attempt is due (`MAX_BACKOFF`
    /// when none waits).
    fn next_attempt(&self) -> Duration {
        let now = Instant::now();
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|at| **at > now)
            .map(|at| *at - now)
            .min()
            .unwrap_or(MAX_BACKOFF)
    }
}

/// The wait after the `failures`-th failure in a row (of a row's
/// publishes, or of the relay's passes): 100 ms, doubling, at most 30 s.
fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}
