//! [`LeaseStore`] for [`RedisStore`]: the claim (`claim.rs`), and the
//! completion, failure, release and extension of a claim, each one function
//! of the store's library that checks the claim's fencing token; a batch is
//! one pipelined round trip (on a cluster, each command on its own, all
//! sent at once).

use redis::{Cmd, Value};

use super::RedisStore;
use super::claim::{Claiming, Step};
use super::exec::{self, answered, backend, reply_err};
use super::record;
use crate::clock::millis;
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::HandlerSpec;
use crate::store::contract::{BatchItem, Claim, Failure, Held, LeaseStore};

impl RedisStore {
    fn complete_cmd(&self, spec: &HandlerSpec, key: &Key, token: &str, outcome: &str) -> Cmd {
        let mut cmd = self.library.complete.on(&self.redis_key(spec.name, key));
        cmd.arg(token)
            .arg(outcome)
            .arg(millis(spec.ttl).max(1))
            .arg(self.clock.now_millis())
            .arg(record::settling_trace_arg());
        cmd
    }

    fn release_cmd(&self, spec: &HandlerSpec, key: &Key, token: &str) -> Cmd {
        let mut cmd = self.library.release.on(&self.redis_key(spec.name, key));
        cmd.arg(token).arg(self.clock.now_millis());
        cmd
    }

    fn extend_cmd(&self, spec: &HandlerSpec, key: &Key, token: &str) -> Cmd {
        let now = self.clock.now_millis();
        let lease = millis(spec.lease).max(1);
        let mut cmd = self.library.extend.on(&self.redis_key(spec.name, key));
        cmd.arg(token)
            .arg(now)
            .arg(now.saturating_add(lease))
            .arg(lease)
            .arg(lease.saturating_add(millis(spec.ttl).max(1)))
            .arg(if spec.max_attempts.is_some() {
                "1"
            } else {
                "0"
            });
        cmd
    }
}

/// The most keys one call of the completion function takes: a call runs
/// alone on the server, so a batch of many thousands is cut into calls
/// that let other clients in between.
const COMPLETE_AT_ONCE: usize = 1000;

/// How often a failed batch's claims are given back before they are left
/// to their leases.
const GIVE_BACK_TRIES: u32 = 4;

impl RedisStore {
    /// Gives back the claims `held` of a batch whose claim failed, trying
    /// again a few times (20, 40, 80 ms apart): the failure may be the
    /// cluster's (a slot being moved, a master failing over), and the
    /// release meets it too. A claim that cannot be given back holds its
    /// key until its lease runs out, and every delivery of that key until
    /// then is `InProgress`. A release is only ever of this claim's own
    /// token, so sending it again is harmless.
    async fn give_back(&self, spec: &'static HandlerSpec, held: &[Held<'_>]) {
        if held.is_empty() {
            return;
        }
        let mut wait = std::time::Duration::from_millis(20);
        for tried in 1..=GIVE_BACK_TRIES {
            match self.release_batch(spec, held).await {
                Ok(()) => return,
                Err(e) if tried == GIVE_BACK_TRIES => {
                    tracing::warn!(error = %e, "could not release a batch's claims; they free themselves when their leases run out");
                }
                Err(_) => {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
            }
        }
    }
}

/// Whether a function answered `1`.
fn one(reply: exec::Reply) -> Result<bool, StoreError> {
    match reply.map_err(backend)? {
        Value::Int(n) => Ok(n == 1),
        other => Err(reply_err("a function", &other)),
    }
}

impl LeaseStore for RedisStore {
    fn store_name(&self) -> &'static str {
        "redis"
    }

    async fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Claim, StoreError> {
        self.claim_one(&Claiming::new(self, spec, key, fingerprint))
            .await
    }

    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
        let mut cmd = self.library.fail.on(&self.redis_key(spec.name, key));
        cmd.arg(token)
            .arg(record::status_letter(failure.status()).to_string())
            .arg(failure.recorded().unwrap_or_default())
            .arg(failure.text())
            .arg(millis(spec.ttl).max(1))
            .arg(self.clock.now_millis())
            .arg(record::settling_trace_arg());
        one(self.call(&cmd).await?)
    }

    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let cmd = self.complete_cmd(spec, key, token, outcome);
        one(self.call(&cmd).await?)
    }

    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        let cmd = self.release_cmd(spec, key, token);
        answered(self.call(&cmd).await?).map(drop)
    }

    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        let cmd = self.extend_cmd(spec, key, token);
        one(self.call(&cmd).await?)
    }

    /// One pipelined round trip of `SET ... NX PX ... GET`, one per key;
    /// then, for the keys whose record may be replaced or is a hash only,
    /// one more of the functions that do it.
    async fn claim_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<Vec<Claim>, StoreError> {
        let claimings: Vec<Claiming<'_>> = items
            .iter()
            .map(|item| Claiming::new(self, spec, item.key, item.fingerprint))
            .collect();
        let mut steps = Vec::with_capacity(claimings.len());
        match self.claim_steps(&claimings, &mut steps).await {
            Ok(()) => Ok(steps.into_iter().map(Step::done_or_contended).collect()),
            Err(e) => {
                // Give back what the batch took before it failed.
                let held: Vec<Held<'_>> = items
                    .iter()
                    .zip(&steps)
                    .filter_map(|(item, step)| match step {
                        Step::Done(Claim::Fresh { token }) => Some(Held {
                            key: item.key,
                            token,
                        }),
                        _ => None,
                    })
                    .collect();
                self.give_back(spec, &held).await;
                Err(e)
            }
        }
    }

    /// One round trip: a call of the completion function over many keys,
    /// one a slot on a cluster (at most 1,000 keys each).
    async fn complete_batch(
        &self,
        spec: &'static HandlerSpec,
        done: &[(Held<'_>, &str)],
    ) -> Result<Vec<bool>, StoreError> {
        let rkeys: Vec<String> = done
            .iter()
            .map(|(held, _)| self.redis_key(spec.name, held.key))
            .collect();
        let groups = self.groups(&rkeys, COMPLETE_AT_ONCE);
        let ttl = millis(spec.ttl).max(1);
        let now = self.clock.now_millis();
        let trace = record::settling_trace_arg();
        let cmds: Vec<Cmd> = groups
            .iter()
            .map(|group| {
                let bytes: usize = group
                    .iter()
                    .map(|&i| rkeys[i].len() + done[i].0.token.len() + done[i].1.len() + 16)
                    .sum();
                let keys = group.iter().map(|&i| rkeys[i].as_str());
                let mut cmd = self.library.complete_many.on_keys(
                    keys,
                    3 + 2 * group.len(),
                    bytes + trace.len(),
                );
                cmd.arg(ttl).arg(now).arg(&trace);
                for &i in group {
                    let (held, outcome) = &done[i];
                    cmd.arg(held.token).arg(*outcome);
                }
                cmd
            })
            .collect();
        let mut completed = vec![false; done.len()];
        for (group, reply) in groups.iter().zip(self.send_all(&cmds).await?) {
            let answers = match reply.map_err(backend)? {
                Value::Array(answers) if answers.len() == group.len() => answers,
                other => return Err(reply_err("a batch's completion", &other)),
            };
            for (&i, answer) in group.iter().zip(answers) {
                completed[i] = match answer {
                    Value::Int(n) => n == 1,
                    other => return Err(reply_err("a batch's completion", &other)),
                };
            }
        }
        Ok(completed)
    }

    /// One pipelined round trip of release functions.
    async fn release_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<(), StoreError> {
        let cmds: Vec<Cmd> = held
            .iter()
            .map(|held| self.release_cmd(spec, held.key, held.token))
            .collect();
        for reply in self.send_all(&cmds).await? {
            answered(reply)?;
        }
        Ok(())
    }

    /// One pipelined round trip of extension functions.
    async fn extend_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        let cmds: Vec<Cmd> = held
            .iter()
            .map(|held| self.extend_cmd(spec, held.key, held.token))
            .collect();
        self.send_all(&cmds).await?.into_iter().map(one).collect()
    }
}
