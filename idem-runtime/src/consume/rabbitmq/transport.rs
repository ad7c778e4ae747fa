//! The RabbitMQ consumer as the front's [`Transport`]: a channel with
//! publisher confirms and the consumer's prefetch, the topology declared on
//! it, and each delivery settled by an ack, or by a copy published (and
//! confirmed) to a retry or dead-letter queue before the original is acked.

use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection};

use super::amqp::{Published, amqp_text, header_u32, header_u64, publish_copy, set, set_text};
use super::{Consumer, DUE};
use crate::BoxError;
use crate::client_tls;
use crate::consume::dead::cause::HEADERS;
use crate::consume::front::transport::{Dead, Opening, Read, Retry, Session, Transport};
use crate::consume::{Attempts, Broker, ConsumeError, Delivery, Meter, Policy, tiers};

impl Transport for Consumer {
    type Connection = Connection;
    type Link = Channel;
    type Message = lapin::message::Delivery;

    const BROKER: Broker = Broker::RabbitMq;

    fn queue(&self) -> &str {
        &self.queue
    }

    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn check(&self) -> Result<(), ConsumeError> {
        self.tls
            .check_amqp(&self.url)
            .map_err(ConsumeError::Setup)?;
        self.check_topology()
    }

    async fn connect(&self) -> Result<Connection, BoxError> {
        client_tls::amqp(&self.url, &self.tls).await
    }

    async fn open(&self, conn: &Connection, meter: &Meter) -> Result<Session<Self>, Opening> {
        self.open_session(conn, meter).await.map_err(|e| {
            if refused(&e) {
                Opening::Refused(Box::new(e))
            } else {
                Opening::Lost(Box::new(e))
            }
        })
    }

    async fn close(&self, conn: Connection) {
        let _ = conn.close(200, "done".into()).await;
    }

    fn read<'m>(&self, msg: &'m lapin::message::Delivery) -> Read<'m> {
        let headers = msg.properties.headers().clone().unwrap_or_default();
        let failures = header_u32(&headers, "x-idem-failures");
        let retries = header_u32(&headers, "x-idem-retries");
        Read {
            payload: &msg.data,
            due: header_u64(&headers, DUE),
            delivery: describe(msg, &headers, retries),
            attempts: Attempts {
                failures,
                retries,
                ..Attempts::default()
            },
            waiting: None,
        }
    }

    async fn ack(&self, _: &Channel, msg: &lapin::message::Delivery) -> Result<(), BoxError> {
        msg.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    async fn retry(
        &self,
        channel: &Channel,
        msg: &lapin::message::Delivery,
        retry: Retry<'_>,
    ) -> Result<(), BoxError> {
        let mut headers = msg.properties.headers().clone().unwrap_or_default();
        set(&mut headers, "x-idem-failures", u64::from(retry.failures));
        set(&mut headers, "x-idem-retries", u64::from(retry.retries));
        set_text(&mut headers, "x-idem-last-error", retry.reason);
        // Due after the wait asked for, not the queue's: an early one is
        // forwarded when it comes back.
        set(&mut headers, DUE, tiers::due_after(retry.after));
        let to = self.retry_queue(retry.after);
        self.hand_over(channel, msg, &to, headers).await
    }

    async fn dead_letter(
        &self,
        channel: &Channel,
        msg: &lapin::message::Delivery,
        dead: Dead<'_>,
    ) -> Result<(), BoxError> {
        let mut headers = msg.properties.headers().clone().unwrap_or_default();
        set_text(&mut headers, "x-idem-reason", dead.reason);
        for (name, value) in dead.cause.map(|c| c.headers(HEADERS)).unwrap_or_default() {
            set_text(&mut headers, name, &value);
        }
        set_text(&mut headers, "x-idem-queue", &self.queue);
        set(&mut headers, "x-idem-failures", u64::from(dead.failures));
        // An id and a time for `consume::dead`: a queue has neither.
        set_text(
            &mut headers,
            super::dead::DEAD_ID,
            &uuid::Uuid::new_v4().to_string(),
        );
        set(
            &mut headers,
            super::dead::DEAD_AT,
            crate::consume::dead::now_ms().unsigned_abs(),
        );
        let to = self.dead_letter_queue();
        self.hand_over(channel, msg, &to, headers).await
    }

    async fn forward(
        &self,
        channel: &Channel,
        msg: &lapin::message::Delivery,
        left: Duration,
    ) -> Result<(), BoxError> {
        // Its headers (counts, due time) as they are.
        let headers = msg.properties.headers().clone().unwrap_or_default();
        let to = self.retry_queue(left);
        self.hand_over(channel, msg, &to, headers).await
    }

    async fn give_back(&self, msg: &lapin::message::Delivery, _: Option<Duration>) {
        // Back to the queue while the channel works; when it does not, the
        // broker requeues it as the channel goes.
        let requeue = BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        };
        let _ = msg.acker.nack(requeue).await;
    }
}

impl Consumer {
    /// Opens a channel, declares the topology on it and starts consuming,
    /// with a task that reports the queue's depth while the session lasts.
    async fn open_session(
        &self,
        conn: &Connection,
        meter: &Meter,
    ) -> Result<Session<Self>, lapin::Error> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        channel
            .basic_qos(self.effective_prefetch(), BasicQosOptions::default())
            .await?;
        self.declare_on(conn, &channel).await?;
        let tag = format!("idem-{}", uuid::Uuid::new_v4().simple());
        let deliveries = channel
            .basic_consume(
                self.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        // The queue's depth, for the lag gauge, every 5 s while the session
        // lasts (a channel of its own: a failed look-up closes it).
        let depth = {
            let (queue, meter, probe) = (
                self.queue.clone(),
                meter.clone(),
                conn.create_channel().await?,
            );
            tokio::spawn(async move {
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                };
                loop {
                    match probe
                        .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                        .await
                    {
                        Ok(q) => meter.lag(u64::from(q.message_count())),
                        Err(_) => break,
                    }
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                let _ = probe.close(200, "done".into()).await;
            })
        };
        let stop_taking = {
            let channel = channel.clone();
            async move {
                let _ = channel
                    .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                    .await;
            }
        };
        let closing = {
            let channel = channel.clone();
            async move {
                depth.abort();
                let _ = channel.close(200, "done".into()).await;
            }
        };
        Ok(Session {
            messages: deliveries.map(|d| d.map_err(BoxError::from)).boxed(),
            link: channel,
            stop_taking: stop_taking.boxed(),
            closing: closing.boxed(),
        })
    }

    /// Declares the topology on `channel` (for [`declare`](Self::declare)
    /// and every session of `run`).
    pub(super) async fn declare_on(
        &self,
        conn: &Connection,
        channel: &Channel,
    ) -> Result<(), lapin::Error> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        // A work queue that exists is used as it is (a quorum queue, one
        // with arguments of its own): only a missing one is declared. The
        // look-up runs on a channel of its own, which a missing queue closes.
        let probe = conn.create_channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let exists = probe
            .queue_declare(self.queue.as_str().into(), passive, FieldTable::default())
            .await
            .is_ok();
        let _ = probe.close(200, "looked".into()).await;
        if !exists {
            channel
                .queue_declare(self.queue.as_str().into(), durable, FieldTable::default())
                .await?;
        }
        for delay in &self.delays {
            let mut args = FieldTable::default();
            args.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
            );
            args.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString(LongString::from("")),
            );
            args.insert(
                "x-dead-letter-routing-key".into(),
                AMQPValue::LongString(LongString::from(self.queue.as_str())),
            );
            channel
                .queue_declare(self.retry_queue(*delay).as_str().into(), durable, args)
                .await?;
        }
        channel
            .queue_declare(
                self.dead_letter_queue().as_str().into(),
                durable,
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    /// Publishes the delivery to queue `to` with `headers` (mandatory, so a
    /// missing queue is an error, not a silent drop), waits for the broker's
    /// confirm, then acknowledges the original.
    ///
    /// The copy keeps the message's identity (content type and encoding,
    /// message and correlation id, timestamp, type, app id, priority, reply
    /// to) but not what would misroute or drop it: `expiration`, and the
    /// `CC`/`BCC` headers.
    async fn hand_over(
        &self,
        channel: &Channel,
        delivery: &lapin::message::Delivery,
        to: &str,
        headers: FieldTable,
    ) -> Result<(), BoxError> {
        if publish_copy(channel, delivery, to, headers, &delivery.data).await? != Published::Taken {
            return Err(format!("the broker did not take the message for {to}").into());
        }
        delivery.ack(BasicAckOptions::default()).await?;
        Ok(())
    }
}

/// Whether the broker refused the set-up for good (access refused, no such
/// vhost or queue, a queue declared with other arguments, an exclusive one
/// in use): a new session would meet the same answer.
fn refused(e: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(
                AMQPSoftError::ACCESSREFUSED
                    | AMQPSoftError::NOTFOUND
                    | AMQPSoftError::RESOURCELOCKED
                    | AMQPSoftError::PRECONDITIONFAILED
            )
        ),
        _ => false,
    }
}

/// What the broker said about `delivery`, for the handler.
fn describe(delivery: &lapin::message::Delivery, headers: &FieldTable, retries: u32) -> Delivery {
    let p = &delivery.properties;
    Delivery {
        broker: Some(Broker::RabbitMq),
        source: delivery.routing_key.to_string(),
        redelivered: delivery.redelivered,
        retries,
        deliveries: retries
            .saturating_add(1)
            .saturating_add(u32::from(delivery.redelivered)),
        id: p.message_id().as_ref().map(|id| id.to_string()),
        published_at: p
            .timestamp()
            .and_then(|secs| std::time::UNIX_EPOCH.checked_add(Duration::from_secs(secs))),
        headers: headers
            .inner()
            .iter()
            .map(|(name, value)| (name.to_string(), amqp_text(value)))
            .collect(),
        ..Delivery::default()
    }
}
