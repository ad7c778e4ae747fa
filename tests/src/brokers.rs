//! The brokers on loopback: where they are, a connection for a test's own
//! publishing and inspecting, and guards that remove a test's queues and
//! streams when it ends.

use std::time::Duration;

use crate::services::unavailable;

/// The RabbitMQ URL: `AMQP_URL`, or the loopback default.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The NATS URL: `NATS_URL`, or the loopback default.
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A channel on the RabbitMQ of [`amqp_url`] (with its connection, which
/// must live as long), or `None` (after [`unavailable`]) when it cannot be
/// reached.
pub async fn amqp_channel() -> Option<(lapin::Connection, lapin::Channel)> {
    let url = amqp_url();
    let connect = lapin::Connection::connect(&url, lapin::ConnectionProperties::default());
    let conn = match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return unavailable("RabbitMQ", &url, e),
        Err(_) => return unavailable("RabbitMQ", &url, "connect timed out"),
    };
    match conn.create_channel().await {
        Ok(channel) => Some((conn, channel)),
        Err(e) => unavailable("RabbitMQ", &url, e),
    }
}

/// A JetStream context on the NATS of [`nats_url`], or `None` (after
/// [`unavailable`]) when it cannot be reached.
pub async fn jetstream() -> Option<async_nats::jetstream::Context> {
    let url = nats_url();
    match tokio::time::timeout(Duration::from_secs(10), async_nats::connect(&url)).await {
        Ok(Ok(client)) => Some(async_nats::jetstream::new(client)),
        Ok(Err(e)) => unavailable("NATS", &url, e),
        Err(_) => unavailable("NATS", &url, "connect timed out"),
    }
}

/// Runs `work` on a fresh thread with a runtime of its own: a guard's
/// clean-up must not depend on the test's runtime, which may be shutting down.
fn on_own_runtime(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(work);
        }
    })
    .join();
}

/// Deletes RabbitMQ queues when dropped.
#[derive(Debug)]
pub struct DeleteQueues(Vec<String>);

impl DeleteQueues {
    /// Deletes `queues` at the end of the scope.
    pub fn new(queues: Vec<String>) -> Self {
        DeleteQueues(queues)
    }
}

impl Drop for DeleteQueues {
    fn drop(&mut self) {
        let queues = std::mem::take(&mut self.0);
        on_own_runtime(async move {
            let Ok(conn) =
                lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
                    .await
            else {
                return;
            };
            if let Ok(channel) = conn.create_channel().await {
                for q in queues {
                    let _ = channel
                        .queue_delete(q.as_str().into(), Default::default())
                        .await;
                }
            }
            let _ = conn.close(200, "done".into()).await;
        });
    }
}

/// Deletes JetStream streams (and so their consumers) when dropped.
#[derive(Debug)]
pub struct DeleteStreams(Vec<String>);

impl DeleteStreams {
    /// Deletes `streams` at the end of the scope.
    pub fn new(streams: Vec<String>) -> Self {
        DeleteStreams(streams)
    }
}

impl Drop for DeleteStreams {
    fn drop(&mut self) {
        let streams = std::mem::take(&mut self.0);
        on_own_runtime(async move {
            let Ok(client) = async_nats::connect(nats_url()).await else {
                return;
            };
            let js = async_nats::jetstream::new(client);
            for s in streams {
                let _ = js.delete_stream(&s).await;
            }
        });
    }
}
