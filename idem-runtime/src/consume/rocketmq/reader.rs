//! Reading a whole topic, each queue from its first offset to the end it
//! had when the read began: the dead letters and their ledger. Nothing is
//! committed.
//!
//! The reader's pull consumer (of a group of its own) lives as long as the
//! client it was made on and is never shut down by itself: rocketmq-client-
//! rust 1.0.0 takes 15 to 20 s to shut one down, while the client's runtime
//! stops at once.

use futures_util::future::BoxFuture;
// The classic pull consumer reads a queue from the offsets it is given,
// which is what reading a whole topic is; the lite pull consumer that
// replaces it follows a group's offsets.
#[allow(deprecated)]
use rocketmq_client_rust::DefaultMQPullConsumer;
use rocketmq_model::common::message::message_ext::MessageExt;

use super::client::Client;
use crate::BoxError;

/// Messages taken by one pull.
const BATCH: i32 = 64;

/// A reader of topics (see [`Client`] for why it is a trait object).
pub(crate) type Reader = std::sync::Arc<dyn ReadTopic>;

/// What a reader does.
pub(crate) trait ReadTopic: Send + Sync {
    /// Every message of `topic`, by queue and offset; `None` when the
    /// topic does not exist, or its route cannot be looked up.
    fn read<'a>(
        &'a self,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<MessageExt>>, BoxError>>;
}

#[allow(deprecated)]
impl ReadTopic for DefaultMQPullConsumer {
    fn read<'a>(
        &'a self,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<MessageExt>>, BoxError>> {
        read_topic(self, topic)
    }
}

/// A started pull consumer of a group of its own.
#[allow(deprecated)]
pub(crate) fn reader(
    client: &Client,
    name_server: &str,
) -> BoxFuture<'static, Result<Reader, BoxError>> {
    let built = DefaultMQPullConsumer::builder(client.runtime())
        .consumer_group(format!("idem-reader-{}", uuid::Uuid::new_v4().simple()))
        .name_server_addr(name_server.to_owned())
        .build();
    Box::pin(async move {
        let consumer = built?;
        consumer.start().await?;
        Ok(std::sync::Arc::new(consumer) as Reader)
    })
}

#[allow(deprecated)]
fn read_topic<'a>(
    consumer: &'a DefaultMQPullConsumer,
    topic: &'a str,
) -> BoxFuture<'a, Result<Option<Vec<MessageExt>>, BoxError>> {
    Box::pin(async move {
        // The client words a missing topic as it words other failures: a
        // failed look-up is taken for a missing topic.
        let Ok(queues) = consumer.fetch_subscribe_message_queues(topic).await else {
            return Ok(None);
        };
        let mut found = Vec::new();
        for mq in queues {
            let mut offset = consumer.min_offset(&mq).await?;
            let end = consumer.max_offset(&mq).await?;
            while offset < end {
                let pulled = consumer.pull(&mq, "*", offset, BATCH).await?;
                found.extend(pulled.msg_found_list().unwrap_or_default().iter().cloned());
                let next = i64::try_from(pulled.next_begin_offset()).unwrap_or(end);
                if next <= offset {
                    break;
                }
                offset = next;
            }
        }
        Ok(Some(found))
    })
}
