//! The claim: `SET key <claim> NX PX <lease> GET` takes a free key or
//! answers the record that stands; the rules every store shares
//! ([`ClaimPlan`]) say what the claim does about it, and a record it may
//! take over is replaced by a function that writes only if the record is
//! still the one the claim read. Each [`Step`] is one round trip, for one
//! key or, pipelined, for a batch.

use std::time::Duration;

use redis::{Cmd, Value};

use super::RedisStore;
use super::exec::{self, backend, reply_err};
use super::library::Library;
use super::record::{self, Parts};
use crate::clock::{expiry, millis};
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::HandlerSpec;
use crate::store::contract::{Claim, Standing};
use crate::store::rules::{ClaimPlan, settle_stall};
use crate::store::{LEASE_RAN_OUT, Status};

/// How often a claim may find that the record it read changed before it
/// could replace it; each time, another delivery wrote the key, so the
/// claim is most likely refused on the next look.
const MAX_SWAPS: usize = 8;

impl RedisStore {
    /// Claims `key` (see [`Claiming`]): `SET ... NX PX ... GET`, then, when
    /// the record found may be replaced or is a hash, the function that does
    /// it, until the claim is taken or refused.
    pub(super) async fn claim_one(&self, claiming: &Claiming<'_>) -> Result<Claim, StoreError> {
        let mut step = claiming.after_set(self.send(&claiming.set()).await?)?;
        for _ in 0..MAX_SWAPS {
            step = match step {
                Step::Done(claim) => return Ok(claim),
                Step::Swap(swap) => {
                    let cmd = claiming.swap(&self.library, &swap);
                    claiming.after_swap(swap, self.call(&cmd).await?)?
                }
                Step::Hash => {
                    let cmd = claiming.hash_claim(&self.library);
                    claiming.after_hash(self.call(&cmd).await?)?
                }
            };
        }
        Ok(step.done_or_contended())
    }

    /// The steps of a batch of claims, each round of them in one pipelined
    /// round trip, until every claim is taken or refused; `steps` holds
    /// where each claim got to, also when a round fails. A round whose
    /// reply to one claim is an error still reads the replies to the
    /// others, so that `steps` holds every claim the round took (the
    /// caller gives them back): a claim left out would hold its key,
    /// unreleased, until its lease ran out.
    pub(super) async fn claim_steps(
        &self,
        claimings: &[Claiming<'_>],
        steps: &mut Vec<Step>,
    ) -> Result<(), StoreError> {
        let sets: Vec<Cmd> = claimings.iter().map(Claiming::set).collect();
        let mut failed = None;
        for (claiming, reply) in claimings.iter().zip(self.send_all(&sets).await?) {
            steps.push(claiming.after_set(reply).unwrap_or_else(|e| {
                failed.get_or_insert(e);
                Step::failed()
            }));
        }
        if let Some(e) = failed {
            return Err(e);
        }
        for _ in 0..MAX_SWAPS {
            let pending: Vec<usize> = (0..steps.len())
                .filter(|&i| !matches!(steps[i], Step::Done(_)))
                .collect();
            if pending.is_empty() {
                break;
            }
            let cmds: Vec<Cmd> = pending
                .iter()
                .map(|&i| match &steps[i] {
                    Step::Swap(swap) => claimings[i].swap(&self.library, swap),
                    _ => claimings[i].hash_claim(&self.library),
                })
                .collect();
            let replies = self.send_all(&cmds).await?;
            let mut failed = None;
            for (&i, reply) in pending.iter().zip(replies) {
                let claiming = &claimings[i];
                let step = match std::mem::replace(&mut steps[i], Step::failed()) {
                    Step::Swap(swap) => claiming.after_swap(swap, reply),
                    _ => claiming.after_hash(reply),
                };
                steps[i] = step.unwrap_or_else(|e| {
                    failed.get_or_insert(e);
                    Step::failed()
                });
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// A fencing token: 32 hex digits, unique in the process (a counter) and
/// across processes (a random number drawn once per process), made without
/// a system call.
fn new_token() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut token = String::with_capacity(32);
    record::push_hex(&mut token, seed);
    record::push_hex(&mut token, n);
    token
}

/// One claim in the making: the key, the new token, the moment, and what
/// the claim writes.
pub(super) struct Claiming<'a> {
    spec: &'static HandlerSpec,
    rkey: String,
    fingerprint: Option<&'a str>,
    token: String,
    now: i64,
}

/// What a claim does next.
pub(super) enum Step {
    Done(Claim),
    /// Replace the record the claim read.
    Swap(Swap),
    /// The key holds a hash of an earlier release: claim it by the
    /// previous release's rules.
    Hash,
}

impl Step {
    /// The place of a claim whose reply was an error, in a batch that
    /// fails: it took nothing.
    fn failed() -> Step {
        Step::Done(Claim::Refused(Standing::InProgress {
            retry_after: crate::retry_after::MIN_RETRY,
        }))
    }

    /// The claim, or, when other deliveries kept changing the record under
    /// this one, the answer that it is busy.
    pub(super) fn done_or_contended(self) -> Claim {
        match self {
            Step::Done(claim) => claim,
            Step::Swap(_) | Step::Hash => Claim::Refused(Standing::InProgress {
                retry_after: crate::retry_after::MIN_RETRY,
            }),
        }
    }
}

/// Write `value` for `px` ms if the key still holds `expected` (`None`:
/// nothing); once written, the claim is acquired, or (`refused`) it
/// settled a stalled claim as the last failure and is refused with that.
pub(super) struct Swap {
    expected: Option<Vec<u8>>,
    value: String,
    px: i64,
    refused: Option<Standing>,
}

impl<'a> Claiming<'a> {
    pub(super) fn new(
        store: &RedisStore,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&'a str>,
    ) -> Claiming<'a> {
        Claiming {
            spec,
            rkey: store.redis_key(spec.name, key),
            fingerprint,
            token: new_token(),
            now: store.clock.now_millis(),
        }
    }

    fn lease_ms(&self) -> i64 {
        millis(self.spec.lease).max(1)
    }

    fn ttl_ms(&self) -> i64 {
        millis(self.spec.ttl).max(1)
    }

    /// How long the key of a claim carrying `failures` lives: its lease, and
    /// a ttl more when it counts (a handler with `max_attempts`, or a claim
    /// that carries failures), so that a consumer that stops inside it is
    /// counted.
    fn px(&self, failures: i64) -> i64 {
        if failures > 0 || self.spec.max_attempts.is_some() {
            self.lease_ms().saturating_add(self.ttl_ms())
        } else {
            self.lease_ms()
        }
    }

    /// The claim's record, carrying `attempts`, `failures` and `last_error`.
    fn value(&self, attempts: i64, failures: i64, last_error: Option<&str>) -> String {
        Parts {
            status: Status::InProgress,
            created: self.now,
            updated: self.now,
            ends: Some(expiry(
                self.now,
                self.spec.lease.max(Duration::from_millis(1)),
            )),
            attempts,
            failures,
            token: &self.token,
            fingerprint: self.fingerprint.unwrap_or_default(),
            last_error,
            outcome: "",
            max_attempts: self.spec.max_attempts,
            trace: None,
        }
        .encode()
    }

    /// `SET key <claim> NX PX <lease> GET`.
    fn set(&self) -> Cmd {
        let value = self.value(1, 0, None);
        let mut cmd = Cmd::with_capacity(7, 32 + self.rkey.len() + value.len());
        cmd.arg("SET")
            .arg(&self.rkey)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(self.px(0))
            .arg("GET");
        cmd
    }

    fn swap(&self, library: &Library, swap: &Swap) -> Cmd {
        let mut cmd = library.swap.on(&self.rkey);
        cmd.arg(swap.expected.as_deref().unwrap_or_default())
            .arg(&swap.value)
            .arg(swap.px)
            // A settled record: its end is when Redis expires it.
            .arg(if swap.refused.is_some() { "1" } else { "0" });
        cmd
    }

    fn hash_claim(&self, library: &Library) -> Cmd {
        let mut cmd = library.hash_claim.on(&self.rkey);
        cmd.arg(&self.token)
            .arg(self.lease_ms())
            .arg(self.now)
            .arg(self.fingerprint.unwrap_or_default())
            .arg(
                self.spec
                    .max_attempts
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            )
            .arg(self.ttl_ms())
            .arg(LEASE_RAN_OUT);
        cmd
    }

    fn acquired(&self) -> Claim {
        Claim::Fresh {
            token: self.token.clone(),
        }
    }

    /// After `SET ... NX ... GET`: claimed, or the record that stands.
    fn after_set(&self, reply: exec::Reply) -> Result<Step, StoreError> {
        match reply {
            Ok(Value::Nil) => Ok(Step::Done(self.acquired())),
            Ok(Value::BulkString(found)) => self.plan(Some(found)),
            Ok(other) => Err(reply_err("a claim", &other)),
            Err(e) if e.code() == Some("WRONGTYPE") => Ok(Step::Hash),
            Err(e) => Err(backend(e)),
        }
    }

    /// What the claim does about the record it found (`None`: the key is
    /// free), by the rules every store shares ([`ClaimPlan`]).
    fn plan(&self, found: Option<Vec<u8>>) -> Result<Step, StoreError> {
        let Some(found) = found else {
            return Ok(Step::Swap(Swap {
                expected: None,
                value: self.value(1, 0, None),
                px: self.px(0),
                refused: None,
            }));
        };
        // The key exists, so a record that is not in progress has not
        // expired: Redis would have deleted it (at the end it says, by its
        // own clock, which this consumer's need not match).
        let mut record = record::decode("", "", &found, i64::MAX)?;
        if record.status != Status::InProgress {
            record.expires_at_ms = i64::MAX;
        }
        if record.token.as_deref() == Some(self.token.as_str()) {
            // This claim's own write, its reply lost and the command sent
            // again.
            return Ok(Step::Done(self.acquired()));
        }
        Ok(
            match ClaimPlan::of(Some(&record), self.spec, self.fingerprint, self.now) {
                ClaimPlan::Refused(standing) => Step::Done(Claim::Refused(standing)),
                ClaimPlan::Exhausted(exhausted) => {
                    settle_stall(&mut record, self.now, self.spec.ttl);
                    Step::Swap(Swap {
                        value: Parts::of(&record).encode(),
                        expected: Some(found),
                        px: self.ttl_ms(),
                        refused: Some(exhausted),
                    })
                }
                ClaimPlan::Take(carried) => Step::Swap(Swap {
                    value: self.value(
                        carried.attempts,
                        carried.failures,
                        carried.last_error.as_deref(),
                    ),
                    expected: Some(found),
                    px: self.px(carried.failures),
                    refused: None,
                }),
            },
        )
    }

    /// After the swap: done, or the record changed meanwhile and the claim
    /// looks again at what it is now.
    fn after_swap(&self, swap: Swap, reply: exec::Reply) -> Result<Step, StoreError> {
        let reply = reply.map_err(backend)?;
        match int_tagged(&reply) {
            Some((1, _)) => Ok(Step::Done(match swap.refused {
                Some(standing) => Claim::Refused(standing),
                None => self.acquired(),
            })),
            Some((0, [current])) => self.plan(bytes(current)?),
            Some((2, _)) => Ok(Step::Hash),
            _ => Err(reply_err("a claim", &reply)),
        }
    }

    /// After the claim of a hash: the previous release's answers.
    fn after_hash(&self, reply: exec::Reply) -> Result<Step, StoreError> {
        let reply = reply.map_err(backend)?;
        let text = |v: &Value| -> Result<String, StoreError> {
            Ok(bytes(v)?
                .map(|b| String::from_utf8(b).map_err(|e| StoreError::Schema(e.to_string())))
                .transpose()?
                .unwrap_or_default())
        };
        let int = |v: &Value| match v {
            Value::Int(i) => Ok(*i),
            other => Err(reply_err("a claim", other)),
        };
        let standing = match int_tagged(&reply) {
            Some((1, [])) => return Ok(Step::Done(self.acquired())),
            // A hash of an earlier release keeps no trace.
            Some((2, [outcome])) => Standing::Completed {
                outcome: text(outcome)?,
                trace: None,
            },
            Some((3, [left])) => Standing::InProgress {
                retry_after: Duration::from_millis(u64::try_from(int(left)?).unwrap_or(0)),
            },
            Some((4, [recorded])) => Standing::Mismatch {
                recorded: text(recorded)?,
            },
            Some((5, [error])) => Standing::Failed {
                error: text(error)?,
                trace: None,
            },
            Some((6, [failures, rest @ ..])) if rest.len() <= 1 => Standing::Exhausted {
                failures: u32::try_from(int(failures)?).unwrap_or(u32::MAX),
                last_error: match rest.first() {
                    Some(e) => bytes(e)?
                        .map(String::from_utf8)
                        .transpose()
                        .map_err(|e| StoreError::Schema(e.to_string()))?,
                    None => None,
                },
            },
            Some((7, [current])) => return self.plan(bytes(current)?),
            _ => return Err(reply_err("a claim", &reply)),
        };
        Ok(Step::Done(Claim::Refused(standing)))
    }
}

/// A function's `{tag, ...}` reply as the tag and the rest.
fn int_tagged(reply: &Value) -> Option<(i64, &[Value])> {
    match reply {
        Value::Array(parts) => match parts.split_first() {
            Some((Value::Int(tag), rest)) => Some((*tag, rest)),
            _ => None,
        },
        _ => None,
    }
}

/// A bulk string's bytes, or `None` for nil.
fn bytes(v: &Value) -> Result<Option<Vec<u8>>, StoreError> {
    match v {
        Value::BulkString(b) => Ok(Some(b.clone())),
        Value::Nil => Ok(None),
        other => Err(reply_err("a claim", other)),
    }
}

#[cfg(test)]
mod tests {
    use super::new_token;

    #[test]
    fn tokens_are_distinct_hex_of_fixed_length() {
        let tokens: std::collections::HashSet<String> = (0..10_000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 10_000);
        assert!(
            tokens
                .iter()
                .all(|t| t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        );
    }
}
