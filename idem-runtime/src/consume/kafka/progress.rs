//! How far a partition may be committed: up to its first message not yet
//! settled, never past one still running, waiting or queued.

use std::collections::BTreeSet;

/// The offsets of one partition the consumer took and has not settled.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Taken and not settled (queued, running, waiting for a retry).
    pending: BTreeSet<i64>,
    /// One past the highest offset taken; `None` before the first.
    next: Option<i64>,
    /// What was last committed (or read back at assignment).
    committed: Option<i64>,
    /// With offsets in the database: what the table holds, written by an
    /// executed message's transaction or by a commit.
    stored: Option<i64>,
}

impl Progress {
    /// The partition starts at `offset` (read back from the offsets
    /// table): the watermark is there until a message is taken, so the next
    /// commit hands it to the broker too.
    pub(crate) fn start_at(&mut self, offset: i64) {
        self.next = Some(self.next.map_or(offset, |n| n.max(offset)));
    }

    /// A message at `offset` was taken.
    pub(crate) fn took(&mut self, offset: i64) {
        self.pending.insert(offset);
        self.next = Some(self.next.map_or(offset + 1, |n| n.max(offset + 1)));
    }

    /// The message at `offset` is settled: executed, a duplicate, handed to
    /// a retry topic or dead-lettered.
    pub(crate) fn settled(&mut self, offset: i64) {
        self.pending.remove(&offset);
    }

    /// The offset to commit: the first one not settled, or one past the
    /// last taken when all are; `None` before anything was taken.
    pub(crate) fn watermark(&self) -> Option<i64> {
        self.pending.first().copied().or(self.next)
    }

    /// The watermark, when it moved past what was committed.
    pub(crate) fn to_commit(&self) -> Option<i64> {
        let mark = self.watermark()?;
        match self.committed {
            Some(c) if c >= mark => None,
            _ => Some(mark),
        }
    }

    /// The watermark, when it moved past what the offsets table holds.
    pub(crate) fn to_store(&self) -> Option<i64> {
        let mark = self.watermark()?;
        match self.stored {
            Some(s) if s >= mark => None,
            _ => Some(mark),
        }
    }

    /// The offsets table holds `offset`.
    pub(crate) fn stored(&mut self, offset: i64) {
        self.stored = Some(self.stored.map_or(offset, |s| s.max(offset)));
    }

    /// A commit failed: the next round commits the watermark again.
    pub(crate) fn commit_failed(&mut self) {
        self.committed = None;
    }

    /// `offset` was committed.
    pub(crate) fn committed(&mut self, offset: i64) {
        self.committed = Some(self.committed.map_or(offset, |c| c.max(offset)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_watermark_stops_at_the_first_unsettled_offset() {
        let mut p = Progress::default();
        assert_eq!(p.watermark(), None);
        for o in 10..15 {
            p.took(o);
        }
        p.settled(11);
        p.settled(12);
        assert_eq!(p.watermark(), Some(10), "10 still runs");
        p.settled(10);
        assert_eq!(p.watermark(), Some(13));
        p.settled(13);
        p.settled(14);
        assert_eq!(p.to_commit(), Some(15));
        p.committed(15);
        assert_eq!(p.to_commit(), None);
        // Written by the last message's transaction: nothing left to save.
        assert_eq!(p.to_store(), Some(15));
        p.stored(15);
        assert_eq!(p.to_store(), None);
    }

    #[test]
    fn a_position_read_back_is_committed_before_any_message() {
        let mut p = Progress::default();
        p.start_at(7);
        p.stored(7);
        assert_eq!((p.to_commit(), p.to_store()), (Some(7), None));
        p.took(7);
        assert_eq!(p.watermark(), Some(7));
        p.settled(7);
        assert_eq!(p.watermark(), Some(8));
    }

    proptest! {
        // Whatever order messages settle in, the watermark never passes an
        // unsettled one and reaches the end once all are settled.
        #[test]
        fn never_past_an_unsettled_message(order in Just((0..40i64).collect::<Vec<_>>()).prop_shuffle()) {
            let mut p = Progress::default();
            for o in 0..40 {
                p.took(o);
            }
            let mut settled = std::collections::BTreeSet::new();
            for o in order {
                p.settled(o);
                settled.insert(o);
                let mark = p.watermark().unwrap();
                prop_assert!((0..mark).all(|x| settled.contains(&x)));
                prop_assert!(mark == 40 || !settled.contains(&mark));
            }
            prop_assert_eq!(p.watermark(), Some(40));
        }
    }
}
