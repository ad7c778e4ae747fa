//! The bridge between the push consumer's listener, which the client calls
//! on a blocking thread and which must answer there, and the front's
//! driver, which takes messages from a stream and settles them
//! asynchronously: each call hands its message to the driver with a channel
//! for the answer, and blocks its thread until the message is settled.

use std::sync::{Arc, Condvar, Mutex, mpsc};

use rocketmq_client_rust::{
    ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, MessageListenerConcurrently,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use tokio::sync::mpsc::UnboundedSender;

use crate::BoxError;

/// What the listener tells the client about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `CONSUME_SUCCESS`: settled (acked, or its copy sent on); the offset
    /// may move past it.
    Consumed,
    /// `RECONSUME_LATER`: the client sends it back through the retry topic
    /// at its next delay level.
    Later,
}

/// A message the listener handed to the driver, with the way back to the
/// listener's call.
pub(crate) struct Taken {
    pub(crate) msg: MessageExt,
    answer: Mutex<Option<mpsc::SyncSender<Answer>>>,
}

impl Taken {
    /// Tells the waiting call what to answer; only the first answer counts.
    /// A message dropped unanswered (a body cut at shutdown) is answered
    /// [`Answer::Later`].
    pub(crate) fn answer(&self, answer: Answer) {
        let sender = self
            .answer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(sender) = sender {
            let _ = sender.send(answer);
        }
    }
}

/// Whether the listener hands messages to the driver: open, then stopped
/// (the driver takes no more; a call waits), then closed (the consumer is
/// shut down; a call is answered [`Answer::Later`]).
///
/// A call that waits while the consumer shuts down keeps its message in
/// the client's process queue, so the offset committed at shutdown stays
/// before it and the next owner of the queue gets it; answered `Later`
/// before, it would go through the retry topic, and at once each queued
/// call after it, until the client stopped calling. A call whose message
/// the driver handed back or dropped at a stop waits the same way.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum State {
    #[default]
    Open,
    Stopped,
    Closed,
}

/// Closes its gate when dropped: a consumer whose `run` is dropped before
/// its shutdown is over releases the calls waiting at the gate.
pub(crate) struct CloseOnDrop(pub(crate) Arc<Gate>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The driver takes no more: calls wait from now on.
    pub(crate) fn stop(&self) {
        let mut state = self.lock();
        *state = (*state).max(State::Stopped);
    }

    /// The consumer is shut down: waiting calls, and later ones, are
    /// answered `Later`.
    pub(crate) fn close(&self) {
        *self.lock() = State::Closed;
        self.changed.notify_all();
    }

    /// Blocks while stopped: returns once the consumer is shut down (or
    /// at once while open).
    fn wait_closed(&self) {
        let _open = self.admits();
    }

    /// Whether a call may hand its message over; blocks while stopped.
    fn admits(&self) -> bool {
        let mut state = self.lock();
        while *state == State::Stopped {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *state == State::Open
    }
}

/// The push consumer's listener.
pub(crate) struct Listener {
    to_driver: UnboundedSender<Result<Taken, BoxError>>,
    gate: Arc<Gate>,
}

impl Listener {
    /// A listener handing messages to `to_driver` while `gate` is open.
    pub(crate) fn new(
        to_driver: UnboundedSender<Result<Taken, BoxError>>,
        gate: Arc<Gate>,
    ) -> Self {
        Listener { to_driver, gate }
    }

    /// Hands `msg` over and waits for its answer.
    fn settle(&self, msg: &MessageExt) -> Answer {
        if !self.gate.admits() {
            return Answer::Later;
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let taken = Taken {
            msg: msg.clone(),
            answer: Mutex::new(Some(tx)),
        };
        if self.to_driver.send(Ok(taken)).is_err() {
            self.gate.wait_closed();
            return Answer::Later;
        }
        match rx.recv() {
            Ok(Answer::Consumed) => Answer::Consumed,
            // Handed back, or dropped unanswered (the driver stopped, or
            // cut its body past the grace): at a stop, the call waits for
            // the shutdown, so the message stays in the client's queue and
            // its offset uncommitted, rather than going through the retry
            // topic.
            Ok(Answer::Later) | Err(_) => {
                self.gate.wait_closed();
                Answer::Later
            }
        }
    }
}

impl MessageListenerConcurrently for Listener {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _: &ConsumeConcurrentlyContext,
    ) -> rocketmq_client_rust::ClientResult<ConsumeConcurrentlyStatus> {
        // One message a call (the consumer's batch size); were there more,
        // a later one handed back sends the earlier ones back too, and
        // their keys make that harmless.
        for msg in msgs {
            if self.settle(msg) == Answer::Later {
                return Ok(ConsumeConcurrentlyStatus::ReconsumeLater);
            }
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}
