//! What the guide's samples name in their hidden lines: the server a sample
//! runs against, and the few broker calls a sample makes around its visible
//! part. Not public API.
//!
//! A sample whose server is unreachable returns early (it skips): it writes
//! a `SKIPPED` line to stderr, but rustdoc does not show a passing
//! doctest's output, so under `cargo test` the skip is silent and the
//! sample counts as `ok`. With `IDEM_REQUIRE_SERVICES=1`, as in the test
//! suite, it panics with the reason instead: then it fails.

use std::io::Write as _;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The URL in the environment variable `var`, or `default`, when a TCP
/// connection to its host and port succeeds; `None` (after a `SKIPPED`
/// line on stderr, which rustdoc hides for a passing doctest) when it does
/// not.
///
/// # Panics
///
/// When the server is unreachable and `IDEM_REQUIRE_SERVICES=1`.
pub fn service(var: &str, default: &str) -> Option<String> {
    let url = std::env::var(var).unwrap_or_else(|_| default.to_owned());
    match reach(&url) {
        Ok(()) => Some(url),
        Err(why) => {
            let line = format!("{var}: {} is unreachable ({why})", without_password(&url));
            if std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1") {
                panic!("{line}; IDEM_REQUIRE_SERVICES=1 makes this a failure");
            }
            // Straight to the process's stderr: the print macros are captured.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {line}; set IDEM_REQUIRE_SERVICES=1 to fail instead"
            );
            None
        }
    }
}

/// Connects to the host and port of `url` (`scheme://[user[:pass]@]host[:port][/...]`).
fn reach(url: &str) -> Result<(), String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    // The first of a comma-separated list (Kafka's bootstrap servers).
    let rest = rest.split(',').next().unwrap_or(rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host_port = if host_port
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host_port.to_owned()
    } else {
        format!("{host_port}:{}", default_port(url))
    };
    let addrs = host_port
        .to_socket_addrs()
        .map_err(|e| format!("{host_port}: {e}"))?;
    let mut last = format!("{host_port}: no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}

fn default_port(url: &str) -> u16 {
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("postgres" | "postgresql") => 5432,
        Some("mysql" | "mariadb") => 3306,
        Some("redis") => 6379,
        Some("amqp") => 5672,
        Some("nats") => 4222,
        _ => 80,
    }
}

fn without_password(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((user, host)) => {
                let user = user.split(':').next().unwrap_or(user);
                format!("{scheme}://{user}@{host}")
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Waits until `done()` holds, for 30 s at the most.
///
/// # Panics
///
/// When it does not hold by then.
pub async fn eventually(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "not done within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Declares `queue` (durable, as the consumer does) and publishes each
/// payload to it with publisher confirms.
///
/// # Errors
///
/// When the broker refuses a call.
#[cfg(feature = "rabbitmq")]
pub async fn rabbitmq_publish(
    url: &str,
    queue: &str,
    payloads: &[&[u8]],
) -> Result<(), lapin::Error> {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), durable, FieldTable::default())
        .await?;
    for payload in payloads {
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                payload,
                BasicProperties::default(),
            )
            .await?
            .await?;
    }
    conn.close(200, "published".into()).await
}

/// Deletes `queue` with the retry and dead-letter queues the consumer
/// declared for it.
///
/// # Errors
///
/// When the broker refuses a call.
#[cfg(feature = "rabbitmq")]
pub async fn rabbitmq_delete(url: &str, queue: &str) -> Result<(), lapin::Error> {
    use crate::consume::rabbitmq::Consumer;
    use lapin::options::QueueDeleteOptions;
    use lapin::{Connection, ConnectionProperties};

    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    let consumer = Consumer::new(url, queue);
    let mut names = vec![queue.to_owned(), consumer.dead_letter_queue()];
    names.extend(consumer.retry_queues());
    for name in names {
        channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    conn.close(200, "deleted".into()).await
}

/// Creates the stream `stream` capturing `subject`, if missing, and
/// publishes each payload to `subject`, waiting for the server's ack.
///
/// # Errors
///
/// When the server refuses a call.
#[cfg(feature = "nats")]
pub async fn nats_publish(
    url: &str,
    stream: &str,
    subject: &str,
    payloads: &[&[u8]],
) -> Result<(), crate::BoxError> {
    use async_nats::jetstream;

    let js = jetstream::new(async_nats::connect(url).await?);
    js.get_or_create_stream(jetstream::stream::Config {
        name: stream.to_owned(),
        subjects: vec![subject.to_owned()],
        ..Default::default()
    })
    .await?;
    for payload in payloads {
        js.publish(subject.to_owned(), payload.to_vec().into())
            .await?
            .await?;
    }
    Ok(())
}

/// Deletes the stream `stream` and its dead-letter stream.
///
/// # Errors
///
/// When the server refuses a call.
#[cfg(feature = "nats")]
pub async fn nats_delete(url: &str, stream: &str) -> Result<(), crate::BoxError> {
    let js = async_nats::jetstream::new(async_nats::connect(url).await?);
    let dead = crate::consume::nats::Consumer::new(url, stream, "-").dead_letter_stream();
    for name in [stream.to_owned(), dead] {
        // a stream the consumer never made is not an error
        let _ = js.delete_stream(&name).await;
    }
    Ok(())
}

/// Creates `topic` with `partitions` partitions on the Kafka brokers
/// `brokers` (an existing one is left as it is).
///
/// # Errors
///
/// When the brokers refuse it.
#[cfg(feature = "kafka")]
pub async fn kafka_create_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
) -> Result<(), crate::BoxError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    for r in admin.create_topics([&new], &AdminOptions::new()).await? {
        if let Err((name, code)) = r
            && code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists
        {
            return Err(format!("could not create {name}: {code}").into());
        }
    }
    Ok(())
}

/// Publishes `payloads` to `topic`, each with its record key, and waits for
/// the brokers' acknowledgements.
///
/// # Errors
///
/// When a publish fails.
#[cfg(feature = "kafka")]
pub async fn kafka_publish(
    brokers: &str,
    topic: &str,
    payloads: &[(&str, &[u8])],
) -> Result<(), crate::BoxError> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("acks", "all")
        .create()?;
    for (key, payload) in payloads {
        producer
            .send(
                FutureRecord::to(topic).key(*key).payload(*payload),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// Deletes `topic` with its retry and dead-letter topics.
///
/// # Errors
///
/// When the brokers cannot be reached.
#[cfg(feature = "kafka")]
pub async fn kafka_delete(brokers: &str, topic: &str) -> Result<(), crate::BoxError> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let consumer = crate::consume::kafka::Consumer::new(brokers, "-", topic);
    let mut names = vec![topic.to_owned(), consumer.dead_letter_topic()];
    names.extend(consumer.retry_topics());
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // a topic the consumer never made is not an error
    let _ = admin.delete_topics(&names, &AdminOptions::new()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_not_shown() {
        assert_eq!(
            without_password("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest@127.0.0.1:5672/%2f"
        );
        assert_eq!(without_password("redis://127.0.0.1"), "redis://127.0.0.1");
    }

    #[test]
    fn an_unreachable_port_is_an_error_naming_it() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let why = reach(&format!("postgres://u@127.0.0.1:{port}/db")).unwrap_err();
        assert!(why.contains(&port.to_string()), "{why}");
    }
}
