//! The in-memory fixture: a [`MemoryStore`] of the test's own; the bodies'
//! effects are counted in a map next to it.

use std::collections::HashMap;
use std::sync::Mutex;

use idem_runtime::clock::ManualClock;
use idem_runtime::store::Record;
use idem_runtime::{Key, MemoryStore};

use super::lease::{BoxFuture, Effects, LeaseFixture, Moves, Time, Token};
use super::{AppError, T0};

/// A memory store, on a manual clock or the system's.
pub(crate) struct MemoryFx {
    pub(crate) store: MemoryStore,
    clock: Option<ManualClock>,
    effects: Mutex<HashMap<String, usize>>,
}

impl Effects for MemoryFx {
    fn apply<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), AppError>> {
        *self
            .effects
            .lock()
            .expect("effects lock")
            .entry(id.to_owned())
            .or_default() += 1;
        Box::pin(async { Ok(()) })
    }
}

impl LeaseFixture for MemoryFx {
    type Store = MemoryStore;
    const COUNTS_TAKEOVERS: bool = true;
    const DELETES_EXPIRED: bool = false;

    async fn open(time: Time) -> Option<Self> {
        let (store, clock) = match time {
            Time::Manual => {
                let clock = ManualClock::new(T0);
                (MemoryStore::with_clock(clock.clone()), Some(clock))
            }
            Time::Real => (MemoryStore::new(), None),
        };
        Some(MemoryFx {
            store,
            clock,
            effects: Mutex::default(),
        })
    }

    fn store(&self) -> &MemoryStore {
        &self.store
    }

    fn time(&self) -> Moves<'_> {
        match &self.clock {
            Some(clock) => Moves::Clock(clock),
            None => Moves::Real,
        }
    }

    async fn record(&self, handler: &str, key: &Key) -> Option<Record> {
        self.store
            .record(handler, key)
            .await
            .expect("the memory store never fails")
    }

    async fn records(&self) -> usize {
        self.store.len()
    }

    async fn token(&self, _: &str, _: &Key) -> Token {
        Token::Hidden
    }

    async fn effects(&self, id: &str) -> usize {
        let effects = self.effects.lock().expect("effects lock");
        effects.get(id).copied().unwrap_or(0)
    }
}
