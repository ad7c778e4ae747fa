//! The delay tiers of the consumers that retry through queues or topics of
//! their own (RabbitMQ's retry queues, Kafka's retry topics), their names,
//! and the due time a retry carries, so that its wait is the one asked for
//! rather than its tier's.
#![cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How early a retry may come back and still run: one that comes back
/// before its due time by more than this is forwarded to the tier for what
/// is left; by less, the consumer waits out the rest itself.
pub(crate) const DUE_SLACK: Duration = Duration::from_millis(20);

/// The placeholder of a retry queue's or topic's name template that takes
/// the tier's delay in milliseconds.
pub(crate) const MS: &str = "{ms}";

/// `delays` as tiers: whole milliseconds, shortest first, each once.
pub(crate) fn normalize(delays: impl IntoIterator<Item = Duration>) -> Vec<Duration> {
    let mut tiers: Vec<Duration> = delays
        .into_iter()
        .map(|d| Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
        .collect();
    tiers.sort_unstable();
    tiers.dedup();
    tiers
}

/// Why `tiers` cannot be used, if they cannot: none at all, or one shorter
/// than a millisecond.
pub(crate) fn check(tiers: &[Duration]) -> Result<(), String> {
    if tiers.is_empty() {
        return Err(
            "no retry delays: `.retry_delays(...)` needs at least one (the default is RETRY_DELAYS)"
                .to_owned(),
        );
    }
    if tiers.first().is_some_and(Duration::is_zero) {
        return Err("a retry delay shorter than 1 ms: each tier is a whole number of milliseconds, at least 1".to_owned());
    }
    Ok(())
}

/// The tier a wait of `wait` goes to: the longest not longer than the wait,
/// or the shortest when the wait is below them all; `None` without tiers.
pub(crate) fn tier(tiers: &[Duration], wait: Duration) -> Option<Duration> {
    tiers
        .iter()
        .rev()
        .find(|d| **d <= wait)
        .or_else(|| tiers.first())
        .copied()
}

/// A tier's name from `template`, its `{ms}` replaced by the tier's delay
/// in milliseconds.
pub(crate) fn expand(template: &str, tier: Duration) -> String {
    template.replace(MS, &tier.as_millis().to_string())
}

/// Why a name template cannot be used, if it cannot: without `{ms}`, every
/// tier would have the same name.
pub(crate) fn check_template(what: &str, template: &str) -> Result<(), String> {
    if template.contains(MS) {
        Ok(())
    } else {
        Err(format!(
            "the {what} name template {template:?} has no {MS}: each delay needs a name of its own"
        ))
    }
}

/// Now, since the Unix epoch.
fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// The due time of a retry that waits `wait` from now, in milliseconds
/// since the Unix epoch, rounded up: never before the wait is over.
pub(crate) fn due_after(wait: Duration) -> u64 {
    let due = now().saturating_add(wait);
    let ms = due.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// What is left until `due` (milliseconds since the Unix epoch); zero once
/// it is past.
pub(crate) fn left_until(due: u64) -> Duration {
    Duration::from_millis(due).saturating_sub(now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_wait_goes_to_the_longest_tier_not_longer() {
        let tiers = normalize(crate::consume::RETRY_DELAYS);
        assert_eq!(tier(&tiers, ms(0)), Some(ms(100)));
        assert_eq!(tier(&tiers, ms(99)), Some(ms(100)));
        assert_eq!(tier(&tiers, ms(100)), Some(ms(100)));
        assert_eq!(tier(&tiers, ms(1_010)), Some(ms(1_000)));
        assert_eq!(tier(&tiers, ms(1_200)), Some(ms(1_000)));
        assert_eq!(tier(&tiers, ms(4_999)), Some(ms(1_000)));
        assert_eq!(tier(&tiers, ms(5_000)), Some(ms(5_000)));
        assert_eq!(tier(&tiers, ms(86_400_000)), Some(ms(300_000)));
        assert_eq!(tier(&[], ms(5)), None);
    }

    #[test]
    fn tiers_are_sorted_whole_milliseconds_each_once() {
        let tiers = normalize([ms(5_000), Duration::from_micros(1_500), ms(1), ms(5_000)]);
        assert_eq!(tiers, [ms(1), ms(5_000)]);
        assert!(check(&tiers).is_ok());
        assert!(check(&[]).unwrap_err().contains("at least one"));
        let zero = normalize([Duration::from_micros(10), ms(3)]);
        assert!(check(&zero).unwrap_err().contains("1 ms"));
    }

    #[test]
    fn names_come_from_the_template() {
        assert_eq!(expand("q.retry.{ms}ms", ms(1_500)), "q.retry.1500ms");
        assert!(check_template("retry queue", "q.retry.{ms}").is_ok());
        assert!(
            check_template("retry queue", "q.retry")
                .unwrap_err()
                .contains("{ms}")
        );
    }

    #[test]
    fn a_due_time_is_never_early() {
        let before = now();
        let due = due_after(ms(1_200));
        assert!(Duration::from_millis(due) >= before + ms(1_200));
        let left = left_until(due);
        assert!(left <= ms(1_201) && left > ms(1_000), "{left:?}");
        assert_eq!(left_until(0), Duration::ZERO);
    }
}
