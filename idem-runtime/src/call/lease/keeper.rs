//! The lease keeper: one task per tokio runtime that extends the leases
//! of every lease-mode call in progress on that runtime, single calls and
//! batches, whatever their store.
//!
//! A lease needs extending only after a third of its length, and most
//! bodies take milliseconds: a call registers its lease when it claims
//! (a map insert under a mutex) and unregisters it when it ends (a map
//! removal); only a body that outlives a third of its lease is ever
//! extended. The keeper's task sleeps until the earliest renewal due,
//! renews what is due through [`LeaseStore::extend`] (each renewal a task
//! of its own, so a store that hangs delays no other lease), and sleeps
//! again. While nothing is registered it keeps waking a lease period
//! apart for a while, so that the next calls find it ready, and then ends;
//! the next call starts it again.
//!
//! A batch registers its claims as one entry, renewed with
//! [`LeaseStore::extend_batch`]: a claim the store says is lost is dropped
//! from the entry, and the others are still kept.
//!
//! The keepers live in a process-wide registry keyed by the runtime's
//! [`Id`](tokio::runtime::Id), held weakly: a keeper never extends a lease
//! held on another runtime, a runtime that shuts down drops its keeper's
//! task with its other tasks, and a keeper with nothing to keep ends after
//! [`IDLE_LIMIT`].
//!
//! A body that blocks its thread still has its lease extended on a
//! multi-threaded runtime: the keeper runs on another worker. When a
//! registration needs the keeper to wake sooner than it planned (or starts
//! it), the registering call yields once before its body, so that the
//! keeper, woken on the call's own worker, re-arms its timer before a body
//! that may block that worker runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::error::StoreError;
use crate::key::Key;
use crate::registry::HandlerSpec;
use crate::store::contract::{Held, LeaseStore};
use crate::telemetry::BodyWatch;

/// How long a keeper with nothing to keep stays ready before its task
/// ends.
pub(crate) const IDLE_LIMIT: Duration = Duration::from_secs(30);

/// The shortest time between two renewals of one lease.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// How often a lease of `spec` is extended: every third of it.
pub(crate) fn period(spec: &HandlerSpec) -> Duration {
    (spec.lease / 3).max(MIN_PERIOD)
}

type Renewal = Pin<Box<dyn Future<Output = Result<Renewed, StoreError>> + Send>>;

/// What one renewal of a registered entry found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Renewed {
    /// Leases the store said another consumer took over.
    lost: usize,
    /// Leases still held, extended.
    held: usize,
}

/// What the keeper knows of a registered entry.
trait Kept: Send + Sync {
    /// Extends the entry's leases once.
    fn renew(self: Arc<Self>) -> Renewal;
    /// The call's bookkeeping, shared with the call.
    fn lease(&self) -> &LeaseState;
}

/// A registered entry of a store of type `S`.
struct Entry<S> {
    store: S,
    spec: &'static HandlerSpec,
    state: LeaseState,
}

impl<S: LeaseStore> Kept for Entry<S> {
    fn renew(self: Arc<Self>) -> Renewal {
        Box::pin(async move {
            let spec = self.spec;
            match &self.state.holding {
                Holding::One { key, token } => {
                    let held = usize::from(self.store.extend(spec, key, token).await?);
                    Ok(Renewed {
                        lost: 1 - held,
                        held,
                    })
                }
                Holding::Batch(leases) => {
                    let leases_now =
                        Arc::clone(&leases.lock().unwrap_or_else(PoisonError::into_inner));
                    let held: Vec<Held<'_>> = leases_now
                        .iter()
                        .map(|(key, token)| Held { key, token })
                        .collect();
                    let extended = self.store.extend_batch(spec, &held).await?;
                    let lost = extended.iter().filter(|e| !**e).count();
                    if lost == 0 {
                        return Ok(Renewed {
                            lost,
                            held: leases_now.len(),
                        });
                    }
                    // The others are still this call's to keep.
                    let mut kept = extended.iter();
                    let left: Arc<[(Key, String)]> = leases_now
                        .iter()
                        .filter(|_| kept.next().copied().unwrap_or(false))
                        .cloned()
                        .collect();
                    let held = left.len();
                    *leases.lock().unwrap_or_else(PoisonError::into_inner) = left;
                    Ok(Renewed { lost, held })
                }
            }
        })
    }

    fn lease(&self) -> &LeaseState {
        &self.state
    }
}

/// What a registered entry holds.
enum Holding {
    /// One call's lease.
    One { key: Key, token: String },
    /// A batch's leases, those not lost yet (only the entry's renewal,
    /// never two at once, replaces them).
    Batch(Mutex<Arc<[(Key, String)]>>),
}

impl Holding {
    /// Logs that `lost` of the leases were taken over by another consumer.
    fn lost(&self, lost: usize) {
        match self {
            Holding::One { .. } => {
                tracing::warn!(
                    "lease lost while the body runs: another consumer took the key over"
                );
            }
            Holding::Batch(_) => tracing::warn!(
                lost,
                "leases lost while the batch body runs: another consumer took keys over"
            ),
        }
    }

    /// Logs that the store could not extend the leases.
    fn not_extended(&self, error: &StoreError) {
        match self {
            Holding::One { .. } => {
                tracing::warn!(error = %error, "could not extend the lease; will retry");
            }
            Holding::Batch(_) => {
                tracing::warn!(error = %error, "could not extend the batch's leases; will retry");
            }
        }
    }
}

/// What a call and the keeper share about its leases.
struct LeaseState {
    period: Duration,
    /// When the leases were last known to start: the claim, or the last
    /// extension the store confirmed (when it was asked for).
    renewed: Mutex<Instant>,
    /// The call's span, for what the keeper logs about the leases.
    span: tracing::Span,
    holding: Holding,
}

/// A lease in the keeper's schedule.
struct Slot {
    /// Tells this lease from an earlier one in the same place.
    generation: u64,
    due: Instant,
    entry: Arc<dyn Kept>,
    /// A renewal is under way.
    renewing: bool,
}

/// When the keeper's task will next look at its schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    /// Its timer is set for then.
    At(Instant),
    /// It is running, or about to, and reads the schedule before it sleeps.
    Busy,
    /// No task serves the keeper.
    Stopped,
}

/// Where a lease is in the schedule: its place, and its generation there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotId {
    index: usize,
    generation: u64,
}

/// The schedule: leases in places that are reused (no hashing, no
/// allocation once it has grown to the calls in flight).
#[derive(Default)]
struct Schedule {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    generations: u64,
    live: usize,
}

impl Schedule {
    fn insert(&mut self, due: Instant, entry: Arc<dyn Kept>) -> SlotId {
        self.generations += 1;
        let slot = Slot {
            generation: self.generations,
            due,
            entry,
            renewing: false,
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.slots[index] = Some(slot);
                index
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.live += 1;
        SlotId {
            index,
            generation: self.generations,
        }
    }

    fn get_mut(&mut self, id: SlotId) -> Option<&mut Slot> {
        self.slots
            .get_mut(id.index)?
            .as_mut()
            .filter(|slot| slot.generation == id.generation)
    }

    fn remove(&mut self, id: SlotId) {
        if self.get_mut(id).is_some() {
            self.slots[id.index] = None;
            self.free.push(id.index);
            self.live -= 1;
        }
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (SlotId, &mut Slot)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(index, slot)| {
                let slot = slot.as_mut()?;
                let id = SlotId {
                    index,
                    generation: slot.generation,
                };
                Some((id, slot))
            })
    }
}

struct State {
    slots: Schedule,
    armed: Armed,
    /// Counts the tasks started, so that a task that ends knows whether it
    /// still is the one serving the keeper.
    task: u64,
    /// The shortest renewal period registered since the task started: how
    /// far apart an idle keeper wakes, so that a new lease is never due
    /// before the keeper looks.
    idle_period: Duration,
    /// Since when the keeper has found its schedule empty.
    idle_since: Option<Instant>,
}

/// One runtime's keeper.
struct Keeper {
    state: Mutex<State>,
    wake: tokio::sync::Notify,
}

impl Keeper {
    fn new() -> Keeper {
        Keeper {
            state: Mutex::new(State {
                slots: Schedule::default(),
                armed: Armed::Stopped,
                task: 0,
                idle_period: IDLE_LIMIT,
                idle_since: None,
            }),
            wake: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update of the state is complete before anything can panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The keeper of the current runtime, made on first use.
fn current() -> Option<Arc<Keeper>> {
    use std::cell::RefCell;
    use tokio::runtime::{Handle, Id};

    static KEEPERS: Mutex<Vec<(Id, Weak<Keeper>)>> = Mutex::new(Vec::new());
    thread_local! {
        static CACHED: RefCell<Option<(Id, Weak<Keeper>)>> = const { RefCell::new(None) };
    }
    let runtime = Handle::try_current().ok()?.id();
    let cached = CACHED.with(|c| match &*c.borrow() {
        Some((id, keeper)) if *id == runtime => keeper.upgrade(),
        _ => None,
    });
    if let Some(keeper) = cached {
        return Some(keeper);
    }
    let mut keepers = KEEPERS.lock().unwrap_or_else(PoisonError::into_inner);
    keepers.retain(|(_, keeper)| keeper.strong_count() > 0);
    let keeper = match keepers
        .iter()
        .find(|(id, _)| *id == runtime)
        .and_then(|(_, keeper)| keeper.upgrade())
    {
        Some(keeper) => keeper,
        None => {
            let keeper = Arc::new(Keeper::new());
            keepers.push((runtime, Arc::downgrade(&keeper)));
            keeper
        }
    };
    CACHED.with(|c| *c.borrow_mut() = Some((runtime, Arc::downgrade(&keeper))));
    Some(keeper)
}

/// A call's registered leases (one call's, or a batch's): the keeper
/// extends them every [`period`] until this is dropped.
///
/// Dropped while its call still runs (its body began, and the call did not
/// reach [`ended`]: its future was dropped at an `.await`, in the body or
/// while the outcome was recorded), it extends its leases once more, on a
/// task of its own, so that the key is held for a whole lease from the
/// drop: what the body set going (a request already sent) has that long to
/// land before another run may take the key. The claim is never released
/// then, and the drop is counted ([`BodyWatch`]). [`last_extensions_done`]
/// waits for those extensions.
///
/// [`ended`]: Lease::ended
pub(crate) struct Lease {
    kept: Option<(Arc<Keeper>, SlotId)>,
    state: Arc<dyn Kept>,
    body: BodyWatch,
}

impl Lease {
    /// Registers the lease `token` holds on `key` since `claimed`, and
    /// makes sure the current runtime's keeper will renew it in time. Off
    /// a tokio runtime there is no keeper: the lease is not extended.
    pub(crate) async fn keep<S: LeaseStore>(
        store: &S,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        claimed: Instant,
    ) -> Lease {
        let holding = Holding::One {
            key: key.clone(),
            token: token.to_owned(),
        };
        Lease::register(store, spec, holding, claimed).await
    }

    /// Registers the leases a batch holds since `claimed`, as
    /// [`keep`](Lease::keep) registers one: they are renewed together,
    /// and a lease the store says is lost is no longer renewed.
    pub(crate) async fn keep_batch<S: LeaseStore>(
        store: &S,
        spec: &'static HandlerSpec,
        holding: &[Held<'_>],
        claimed: Instant,
    ) -> Lease {
        let leases = holding
            .iter()
            .map(|h| (h.key.clone(), h.token.to_owned()))
            .collect();
        Lease::register(store, spec, Holding::Batch(Mutex::new(leases)), claimed).await
    }

    async fn register<S: LeaseStore>(
        store: &S,
        spec: &'static HandlerSpec,
        holding: Holding,
        claimed: Instant,
    ) -> Lease {
        let period = period(spec);
        // The body begins once the lease is registered (below).
        let body = BodyWatch::before(spec, "lease", tracing::Span::current());
        let entry: Arc<dyn Kept> = Arc::new(Entry {
            store: store.clone(),
            spec,
            state: LeaseState {
                period,
                renewed: Mutex::new(claimed),
                span: tracing::Span::current(),
                holding,
            },
        });
        let Some(keeper) = current() else {
            tracing::warn!("no tokio runtime: the lease is not extended while the body runs");
            let mut lease = Lease {
                kept: None,
                state: entry,
                body,
            };
            lease.body.begin();
            return lease;
        };
        let due = claimed + period;
        let (id, start, wake) = {
            let mut state = keeper.lock();
            let id = state.slots.insert(due, Arc::clone(&entry));
            state.idle_period = state.idle_period.min(period);
            state.idle_since = None;
            let (start, wake) = match state.armed {
                Armed::Stopped => (true, false),
                Armed::At(at) if due < at => (false, true),
                Armed::At(_) | Armed::Busy => (false, false),
            };
            if start || wake {
                state.armed = Armed::Busy;
            }
            if start {
                state.task += 1;
            }
            (id, start.then_some(state.task), wake)
        };
        if let Some(task) = start {
            tokio::spawn(run(Serving {
                keeper: Arc::clone(&keeper),
                task,
            }));
        } else if wake {
            keeper.wake.notify_one();
        }
        // Made before the yield: dropped there, the call unregisters its
        // lease (its body never began).
        let mut lease = Lease {
            kept: Some((keeper, id)),
            state: entry,
            body,
        };
        if start.is_some() || wake {
            // The keeper's task was woken on this worker, which no other
            // worker takes it from: let it run (and arm its timer) before a
            // body that may block this thread.
            tokio::task::yield_now().await;
        }
        lease.body.begin();
        lease
    }

    /// The call came to its end: its body ran, and its outcome was
    /// recorded (or its claim released or failed, or what the store said
    /// is the call's error). From here on, a drop of the call is no drop of
    /// its body.
    pub(crate) fn ended(&mut self) {
        self.body.ended();
    }

    /// The earliest the leases may end: they started no earlier than the
    /// last renewal was asked for.
    pub(crate) fn ends(&self, spec: &HandlerSpec) -> Instant {
        *self
            .state
            .lease()
            .renewed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            + spec.lease
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some((keeper, id)) = &self.kept {
            keeper.lock().slots.remove(*id);
        }
        if self.body.running() {
            // Held a whole lease from now, not what is left of the last
            // renewal's: the last word on the key until it runs out.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let span = self.state.lease().span.clone();
                let renewal = Arc::clone(&self.state).renew();
                let pending = LastExtension::start();
                runtime.spawn(
                    async move {
                        let _pending = pending;
                        if let Err(e) = renewal.await {
                            tracing::warn!(error = %e, "could not hold the dropped body's lease for one more lease: it runs out as it is");
                        }
                    }
                    .instrument(span),
                );
            }
        }
    }
}

/// The last extensions of dropped bodies' leases still under way, in the
/// whole process.
static LAST_EXTENSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Told when [`LAST_EXTENSIONS`] comes back to zero.
static LAST_EXTENSIONS_DONE: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// One last extension under way, counted until it is dropped (done, or
/// dropped with its runtime).
struct LastExtension;

impl LastExtension {
    fn start() -> LastExtension {
        LAST_EXTENSIONS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        LastExtension
    }
}

impl Drop for LastExtension {
    fn drop(&mut self) {
        if LAST_EXTENSIONS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            LAST_EXTENSIONS_DONE.notify_waiters();
        }
    }
}

/// Resolves once no last extension of a dropped body's lease is under way:
/// what a caller that dropped calls waits for before its runtime ends,
/// which would drop the extensions too.
#[cfg(any(feature = "http", feature = "_consume"))]
pub(crate) async fn last_extensions_done() {
    loop {
        let done = LAST_EXTENSIONS_DONE.notified();
        let mut done = std::pin::pin!(done);
        done.as_mut().enable();
        if LAST_EXTENSIONS.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return;
        }
        done.await;
    }
}

/// The keeper's task `task`: when it ends, also when its runtime drops
/// it at shutdown, the keeper is served by no task (unless a later one
/// serves it already).
struct Serving {
    keeper: Arc<Keeper>,
    task: u64,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut state = self.keeper.lock();
        if state.task == self.task {
            state.armed = Armed::Stopped;
        }
    }
}

/// The keeper's task: renews what is due, then sleeps until the next
/// renewal due (or a registration that is due sooner wakes it).
async fn run(serving: Serving) {
    let keeper = &serving.keeper;
    loop {
        let now = Instant::now();
        let (due, wake_at) = {
            let mut state = keeper.lock();
            let mut due = Vec::new();
            let mut next: Option<Instant> = None;
            let mut renewing = false;
            for (id, slot) in state.slots.iter_mut() {
                if slot.renewing {
                    renewing = true;
                    continue;
                }
                if slot.due <= now {
                    slot.renewing = true;
                    renewing = true;
                    due.push((id, Arc::clone(&slot.entry)));
                } else {
                    next = Some(next.map_or(slot.due, |n| n.min(slot.due)));
                }
            }
            if state.slots.live > 0 {
                state.idle_since = None;
            }
            if next.is_none() && !renewing {
                let idle_since = *state.idle_since.get_or_insert(now);
                if now.duration_since(idle_since) >= IDLE_LIMIT {
                    // Nothing to keep for a while: end. The next
                    // registration starts a task again.
                    state.armed = Armed::Stopped;
                    return;
                }
                next = Some(now + state.idle_period);
            }
            let wake_at = next.unwrap_or(now + state.idle_period);
            state.armed = Armed::At(wake_at);
            (due, wake_at)
        };
        for (id, entry) in due {
            let span = entry.lease().span.clone();
            tokio::spawn(renew(Arc::clone(keeper), id, entry).instrument(span));
        }
        tokio::select! {
            () = tokio::time::sleep_until(wake_at.into()) => {}
            () = keeper.wake.notified() => {}
        }
        keeper.lock().armed = Armed::Busy;
    }
}

/// Extends one entry's leases, and schedules its next renewal a period
/// after this one was asked for.
async fn renew(keeper: Arc<Keeper>, id: SlotId, entry: Arc<dyn Kept>) {
    let asked = Instant::now();
    let renewed = Arc::clone(&entry).renew().await;
    let lease = entry.lease();
    let mut state = keeper.lock();
    if state.slots.get_mut(id).is_none() {
        // The call ended meanwhile: whatever the store said is no news.
        return;
    }
    match renewed {
        Ok(Renewed { lost, held }) => {
            if lost > 0 {
                lease.holding.lost(lost);
            }
            if held == 0 {
                state.slots.remove(id);
                return;
            }
            *lease.renewed.lock().unwrap_or_else(PoisonError::into_inner) = asked;
        }
        Err(e) => lease.holding.not_extended(&e),
    }
    let due = asked + lease.period;
    if let Some(slot) = state.slots.get_mut(id) {
        slot.due = due;
        slot.renewing = false;
    }
    if matches!(state.armed, Armed::At(at) if due < at) {
        state.armed = Armed::Busy;
        drop(state);
        keeper.wake.notify_one();
    }
}
