//! TLS to every store and broker, against servers of the tests' own that
//! take TLS only (`idem_tests::tls`), with certificates each test makes: a
//! handler (or a consumer) works over TLS, verified against the test CA; a
//! URL can ask for it by itself; the second CA is refused as an unknown
//! CA, a host the certificate does not name as a wrong name, an expired
//! certificate as expired; a plain-text client is refused; and where the
//! server asks for a client certificate, the test CA's is taken and the
//! second CA's, or none, is refused.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::AppError;
use common::broker::{self, Effects, Points, Running};
use idem_runtime::tls::{Refusal, Tls, TlsError, refusal};
use idem_runtime::{Outcome, PgTx, idempotent};
use idem_tests::tls::{
    Certs, MTLS_USER, Pair, SERVER_NAME, TlsMariaDb, TlsNats, TlsPostgres, TlsRabbitMq, TlsRedis,
    started,
};
use idem_tests::{or_skip, unique_table};

fn trusting(certs: &Certs) -> Tls {
    Tls::new().ca_file(certs.ca()).expect("the test CA")
}

fn trusting_other(certs: &Certs) -> Tls {
    Tls::new().ca_file(certs.other_ca()).expect("the second CA")
}

fn with_client(tls: Tls, pair: &Pair) -> Tls {
    tls.client_identity_files(&pair.cert, &pair.key)
        .expect("a client certificate")
}

/// `result`'s error, which must be a certificate refusal of `why`.
fn refused_as<T, E: std::error::Error + 'static>(result: Result<T, E>, why: Refusal, what: &str) {
    match result {
        Ok(_) => panic!("{what}: connected"),
        Err(e) => assert_eq!(refusal(&e), Some(why), "{what}: {e}"),
    }
}

#[idempotent(key = "id", ttl = "1h", store = "postgres")]
async fn tls_pg_grant(tx: &mut PgTx<'_>, msg: &Points) -> Result<u32, AppError> {
    let n: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut **tx).await?;
    Ok(msg.points + u32::try_from(n).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls() {
    let certs = Certs::make();
    let pg = or_skip!(started("PostgreSQL over TLS", TlsPostgres::start(&certs)));
    let tls = trusting(&certs);

    // A transaction-mode handler, verified against the test CA.
    let store = idem_runtime::PgStore::connect_tls(&pg.url(""), &tls)
        .await
        .expect("verified TLS")
        .with_table(&unique_table("tls_pg"))
        .expect("a table");
    store.migrate().await.expect("migrated");
    let msg = Points {
        id: "p-1".into(),
        points: 4,
    };
    assert_eq!(
        tls_pg_grant(&store, &msg).await.expect("ran"),
        Outcome::Executed(5)
    );
    assert_eq!(
        tls_pg_grant(&store, &msg).await.expect("ran"),
        Outcome::Duplicate(5)
    );

    // The URL alone asks for it.
    let ca = certs.ca().display().to_string();
    idem_runtime::PgStore::connect(&pg.url(&format!("sslmode=verify-full&sslrootcert={ca}")))
        .await
        .expect("TLS asked by the URL");

    refused_as(
        idem_runtime::PgStore::connect_tls(&pg.url(""), &trusting_other(&certs)).await,
        Refusal::UnknownCa,
        "the second CA",
    );
    refused_as(
        idem_runtime::PgStore::connect_tls(&pg.url_as("postgres", "127.0.0.2", ""), &tls).await,
        Refusal::WrongName,
        "127.0.0.2",
    );
    let plain = idem_runtime::PgStore::connect(&pg.url("sslmode=disable"))
        .await
        .expect_err("plain text is refused");
    assert!(plain.to_string().contains("no encryption"), "{plain}");

    // Mutual TLS for the user that must present a certificate.
    let mtls = pg.url_as(MTLS_USER, "127.0.0.1", "");
    let none = idem_runtime::PgStore::connect_tls(&mtls, &tls)
        .await
        .expect_err("no client certificate");
    assert!(
        none.to_string()
            .contains("requires a valid client certificate"),
        "{none}"
    );
    idem_runtime::PgStore::connect_tls(&mtls, &with_client(tls.clone(), &certs.client()))
        .await
        .expect("the test CA's client certificate");
    refused_as(
        idem_runtime::PgStore::connect_tls(&mtls, &with_client(tls.clone(), &certs.other_client()))
            .await,
        Refusal::ClientCertificateRefused,
        "the second CA's client certificate",
    );

    // sqlx verifies the host it dials: a server name is refused, not ignored
    let named = idem_runtime::PgStore::connect_tls(
        &pg.url(""),
        &tls.clone().server_name(SERVER_NAME).expect("a name"),
    )
    .await
    .expect_err("a server name on PostgreSQL");
    assert!(
        matches!(named, idem_runtime::StoreError::Tls(ref e) if matches!(**e, TlsError::Unsupported { .. })),
        "{named}"
    );

    // Without verification, encrypted to whoever answers.
    idem_runtime::PgStore::connect_tls(&pg.url(""), &Tls::new().danger_accept_invalid_certs())
        .await
        .expect("unverified TLS");
}

#[idempotent(key = "id", ttl = "1h", store = "mysql")]
async fn tls_mysql_grant(
    tx: &mut idem_runtime::MySqlTx<'_>,
    msg: &Points,
) -> Result<u32, AppError> {
    let n: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut **tx).await?;
    Ok(msg.points + u32::try_from(n).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_over_tls() {
    let certs = Certs::make();
    let db = or_skip!(started("MariaDB over TLS", TlsMariaDb::start(&certs)));
    let tls = trusting(&certs);

    let store = idem_runtime::MySqlStore::connect_tls(&db.url("idem", ""), &tls)
        .await
        .expect("verified TLS")
        .with_table(&unique_table("tls_mysql"))
        .expect("a table");
    store.migrate().await.expect("migrated");
    let msg = Points {
        id: "m-1".into(),
        points: 2,
    };
    assert_eq!(
        tls_mysql_grant(&store, &msg).await.expect("ran"),
        Outcome::Executed(3)
    );
    assert_eq!(
        tls_mysql_grant(&store, &msg).await.expect("ran"),
        Outcome::Duplicate(3)
    );

    let ca = certs.ca().display().to_string();
    idem_runtime::MySqlStore::connect(
        &db.url("idem", &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")),
    )
    .await
    .expect("TLS asked by the URL");

    refused_as(
        idem_runtime::MySqlStore::connect_tls(&db.url("idem", ""), &trusting_other(&certs)).await,
        Refusal::UnknownCa,
        "the second CA",
    );
    // require_secure_transport: MariaDB refuses a plain-text login as it
    // would a wrong password (the same user logged in over TLS above).
    let plain = idem_runtime::MySqlStore::connect(&db.url("idem", "ssl-mode=DISABLED"))
        .await
        .expect_err("plain text is refused");
    assert!(
        plain.to_string().contains("Access denied for user 'idem'"),
        "{plain}"
    );

    // REQUIRE X509
    let mtls = db.url(MTLS_USER, "");
    let none = idem_runtime::MySqlStore::connect_tls(&mtls, &tls)
        .await
        .expect_err("no client certificate");
    assert!(
        none.to_string()
            .contains("Access denied for user 'idem_mtls'"),
        "{none}"
    );
    idem_runtime::MySqlStore::connect_tls(&mtls, &with_client(tls.clone(), &certs.client()))
        .await
        .expect("the test CA's client certificate");
    refused_as(
        idem_runtime::MySqlStore::connect_tls(
            &mtls,
            &with_client(tls.clone(), &certs.other_client()),
        )
        .await,
        Refusal::ClientCertificateRefused,
        "the second CA's client certificate",
    );
}

#[idempotent(key = "msg.id", ttl = "1h", store = "redis", lease = "10s")]
async fn tls_redis_grant(msg: &Points, effects: &Effects) -> Result<u32, AppError> {
    effects.apply(&msg.id);
    Ok(msg.points)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls() {
    let certs = Certs::make();
    let redis = or_skip!(started("Redis over TLS", TlsRedis::start(&certs)));
    let tls = trusting(&certs);

    let store = idem_runtime::RedisStore::connect_tls(&redis.url(), &tls)
        .await
        .expect("verified TLS");
    let effects = Effects::default();
    let msg = Points {
        id: "r-1".into(),
        points: 7,
    };
    assert_eq!(
        tls_redis_grant(&store, &msg, &effects).await.expect("ran"),
        Outcome::Executed(7)
    );
    assert_eq!(
        tls_redis_grant(&store, &msg, &effects).await.expect("ran"),
        Outcome::Duplicate(7)
    );
    assert_eq!(effects.of("r-1"), 1);

    refused_as(
        idem_runtime::RedisStore::connect_tls(&redis.url(), &trusting_other(&certs)).await,
        Refusal::UnknownCa,
        "the second CA",
    );
    refused_as(
        idem_runtime::RedisStore::connect_tls(&redis.url_as("rediss", "127.0.0.2"), &tls).await,
        Refusal::WrongName,
        "127.0.0.2",
    );
    // TLS settings with a plain-text URL: refused before connecting.
    let plain_scheme =
        idem_runtime::RedisStore::connect_tls(&redis.url_as("redis", "127.0.0.1"), &tls)
            .await
            .expect_err("redis:// with TLS settings");
    assert!(
        plain_scheme.to_string().contains("rediss://"),
        "{plain_scheme}"
    );
    // A plain-text client at the TLS port: the server drops it.
    let plain = tokio::time::timeout(
        Duration::from_secs(20),
        idem_runtime::RedisStore::connect(&redis.url_as("redis", "127.0.0.1")),
    )
    .await
    .expect("an answer within 20 s")
    .expect_err("a plain-text client was let in");
    assert!(plain.to_string().contains("reset by peer"), "{plain}");
    // redis-rs verifies the host it dials: a server name is refused
    idem_runtime::RedisStore::connect_tls(
        &redis.url(),
        &tls.clone().server_name(SERVER_NAME).expect("a name"),
    )
    .await
    .expect_err("a server name on Redis");
    idem_runtime::RedisStore::connect_tls(&redis.url(), &Tls::new().danger_accept_invalid_certs())
        .await
        .expect("unverified TLS");

    let expired = or_skip!(started("Redis over TLS", TlsRedis::expired(&certs)));
    refused_as(
        idem_runtime::RedisStore::connect_tls(&expired.url(), &tls).await,
        Refusal::Expired,
        "the expired certificate",
    );

    let mutual = or_skip!(started("Redis over mutual TLS", TlsRedis::mutual(&certs)));
    refused_as(
        idem_runtime::RedisStore::connect_tls(&mutual.url(), &tls).await,
        Refusal::ClientCertificateRequired,
        "no client certificate",
    );
    let store = idem_runtime::RedisStore::connect_tls(
        &mutual.url(),
        &with_client(tls.clone(), &certs.client()),
    )
    .await
    .expect("the test CA's client certificate");
    let msg = Points {
        id: "r-2".into(),
        points: 1,
    };
    assert_eq!(
        tls_redis_grant(&store, &msg, &effects).await.expect("ran"),
        Outcome::Executed(1)
    );
    refused_as(
        idem_runtime::RedisStore::connect_tls(
            &mutual.url(),
            &with_client(tls.clone(), &certs.other_client()),
        )
        .await,
        Refusal::ClientCertificateRefused,
        "the second CA's client certificate",
    );
}

/// Three messages and a poison one, staged through an outbox destination
/// `to`: what each broker's consumer below takes.
async fn publish_four<D: idem_runtime::outbox::Destination>(to: &D, destination: &str) {
    use idem_runtime::outbox::{MessageId, Outgoing};
    for (i, payload) in [
        Points::payload("a", 1),
        Points::payload("b", 2),
        Points::payload("c", 3),
        b"not points".to_vec(),
    ]
    .into_iter()
    .enumerate()
    {
        let id = MessageId::derive("tls", "four", u32::try_from(i).unwrap_or(0));
        to.publish(&Outgoing::for_test(id, destination, payload))
            .await
            .expect("published over TLS");
    }
}

/// Runs `$consumer` over TLS on the four messages of [`publish_four`]:
/// three take effect and are acked, the poison one is dead-lettered, which
/// `$dead_letters` (an async count of the dead-letter queue) sees.
macro_rules! three_and_a_dead_letter {
    ($consumer:expr, $dead_letters:expr) => {{
        let effects = Arc::new(Effects::default());
        let handler = {
            let store = idem_runtime::MemoryStore::new();
            let effects = Arc::clone(&effects);
            move |msg: Points| {
                let (store, effects) = (store.clone(), Arc::clone(&effects));
                async move { broker::grant(&store, &msg, &effects).await }
            }
        };
        let (stop, signal) = broker::shutdown();
        let running = Running::new(stop, tokio::spawn($consumer.run(handler, signal)));
        common::eventually(Duration::from_secs(20), "three effects", || async {
            effects.total() == 3
        })
        .await;
        common::eventually(Duration::from_secs(20), "a dead letter", $dead_letters).await;
        let report = running.stop().await;
        assert_eq!((report.acked, report.dead_lettered), (3, 1), "{report:?}");
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_over_tls() {
    use idem_runtime::consume::nats::{Consumer, dead::DeadLetters};
    use idem_runtime::outbox::NatsDestination;
    let certs = Certs::make();
    let nats = or_skip!(started("NATS over TLS", TlsNats::start(&certs)));
    let tls = trusting(&certs);
    let stream = unique_table("TLS_NATS").to_uppercase();
    let subject = format!("idem.tls.{stream}");
    let consumer = |url: String| Consumer::new(url, stream.clone(), subject.clone());

    let verified = consumer(nats.url()).tls(tls.clone());
    verified.declare().await.expect("declared over TLS");
    let to = NatsDestination::connect_tls(&nats.url(), &tls)
        .await
        .expect("an outbox destination over TLS");
    publish_four(&to, &subject).await;
    let dead = DeadLetters::connect_tls(&nats.url(), &verified.dead_letter_stream(), &tls)
        .await
        .expect("the dead letters over TLS");
    three_and_a_dead_letter!(verified.clone(), || async {
        dead.count().await.unwrap_or(0) == 1
    });

    refused_as(
        consumer(nats.url())
            .tls(trusting_other(&certs))
            .declare()
            .await,
        Refusal::UnknownCa,
        "the second CA",
    );
    // a client not told of the test CA: the server asks for TLS, and the
    // client's public roots do not hold the CA
    refused_as(
        consumer(nats.url_as("nats")).declare().await,
        Refusal::UnknownCa,
        "a client without the test CA",
    );
    // the server name verified instead of the address dialled
    let named = |name: &str| tls.clone().server_name(name).expect("a name");
    consumer(nats.url())
        .tls(named(SERVER_NAME))
        .declare()
        .await
        .expect("the certificate's DNS name");
    refused_as(
        consumer(nats.url())
            .tls(named("other.idem.test"))
            .declare()
            .await,
        Refusal::WrongName,
        "a name the certificate does not hold",
    );

    let mutual = or_skip!(started("NATS over mutual TLS", TlsNats::mutual(&certs)));
    // nats-server answers a missing certificate and a foreign one alike
    refused_as(
        consumer(mutual.url()).tls(tls.clone()).declare().await,
        Refusal::ClientCertificateRefused,
        "no client certificate",
    );
    consumer(mutual.url())
        .tls(with_client(tls.clone(), &certs.client()))
        .declare()
        .await
        .expect("the test CA's client certificate");
    refused_as(
        consumer(mutual.url())
            .tls(with_client(tls.clone(), &certs.other_client()))
            .declare()
            .await,
        Refusal::ClientCertificateRefused,
        "the second CA's client certificate",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_over_tls() {
    use idem_runtime::consume::rabbitmq::{Consumer, dead::DeadLetters};
    use idem_runtime::outbox::RabbitMqDestination;
    let certs = Certs::make();
    let rabbit = or_skip!(started("RabbitMQ over TLS", TlsRabbitMq::start(&certs)));
    let tls = trusting(&certs);
    let queue = unique_table("tls_rabbit");
    let consumer = |url: String| Consumer::new(url, queue.clone());

    let verified = consumer(rabbit.url()).tls(tls.clone());
    verified.declare().await.expect("declared over TLS");
    let to = RabbitMqDestination::connect_tls(&rabbit.url(), &tls)
        .await
        .expect("an outbox destination over TLS");
    publish_four(&to, &queue).await;
    let dead = DeadLetters::connect_tls(&rabbit.url(), &verified.dead_letter_queue(), &tls)
        .await
        .expect("the dead letters over TLS");
    three_and_a_dead_letter!(verified.clone(), || async {
        dead.count().await.unwrap_or(0) == 1
    });

    refused_as(
        consumer(rabbit.url())
            .tls(trusting_other(&certs))
            .declare()
            .await,
        Refusal::UnknownCa,
        "the second CA",
    );
    // the CA given is the only one trusted: the public roots are not
    refused_as(
        consumer(rabbit.url()).tls(Tls::new()).declare().await,
        Refusal::UnknownCa,
        "the public roots",
    );
    // TLS settings with amqp://: refused at once, by declare and by run
    // (which would otherwise retry for ever)
    let scheme = consumer(rabbit.url_as("amqp"))
        .tls(tls.clone())
        .declare()
        .await
        .expect_err("amqp:// with TLS settings");
    assert!(scheme.to_string().contains("amqps://"), "{scheme}");
    let run = tokio::time::timeout(
        Duration::from_secs(10),
        consumer(rabbit.url_as("amqp")).tls(tls.clone()).run(
            |_: Points| async { Ok::<_, idem_runtime::Error<AppError>>(Outcome::Executed(0)) },
            idem_runtime::consume::CancellationToken::new(),
        ),
    )
    .await
    .expect("run refuses at once")
    .expect_err("amqp:// with TLS settings");
    assert!(run.to_string().contains("amqps://"), "{run}");
    // a plain-text client at the TLS listener
    let plain = tokio::time::timeout(
        Duration::from_secs(20),
        consumer(rabbit.url_as("amqp")).declare(),
    )
    .await
    .expect("an answer within 20 s")
    .expect_err("a plain-text client was let in");
    assert!(plain.to_string().contains("use amqps://"), "{plain}");
    let named = |name: &str| tls.clone().server_name(name).expect("a name");
    consumer(rabbit.url())
        .tls(named(SERVER_NAME))
        .declare()
        .await
        .expect("the certificate's DNS name");
    refused_as(
        consumer(rabbit.url())
            .tls(named("other.idem.test"))
            .declare()
            .await,
        Refusal::WrongName,
        "a name the certificate does not hold",
    );
    consumer(rabbit.url())
        .tls(Tls::new().danger_accept_invalid_certs())
        .declare()
        .await
        .expect("unverified TLS");

    // The broker asks for a client certificate and verifies one given.
    consumer(rabbit.url())
        .tls(with_client(tls.clone(), &certs.client()))
        .declare()
        .await
        .expect("the test CA's client certificate");
    // TLS 1.3: RabbitMQ checks a client's certificate after the client has
    // finished its side of the handshake, then sends its alert and closes;
    // a client already writing its AMQP header may read the reset before
    // the alert. Either way the connection is refused.
    match consumer(rabbit.url())
        .tls(with_client(tls.clone(), &certs.other_client()))
        .declare()
        .await
    {
        Ok(_) => panic!("the second CA's client certificate: connected"),
        Err(e) => {
            let reset = e.to_string().contains("Connection reset by peer");
            assert!(
                reset || refusal(&e) == Some(Refusal::ClientCertificateRefused),
                "the second CA's client certificate: {e}"
            );
        }
    }
}

/// tansu, the Kafka-API broker of the tests, takes no TLS (0.6 parses
/// `--cert` and never wraps a connection in it), so Kafka over TLS is
/// shown from the client's side only: librdkafka is built with OpenSSL and
/// takes the settings of a [`Tls`] (a build without it refuses
/// `security.protocol=ssl` and `ssl.ca.pem` when the client is made), and
/// a consumer that speaks TLS to a plain-text broker gets no answer to its
/// handshake: the broker is reported down, within the connection set-up
/// timeout, rather than reached in plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_with_tls_to_a_plain_text_broker_is_not_reached() {
    use idem_runtime::consume::kafka::{Consumer, dead::DeadLetters};
    let kafka = or_skip!(idem_tests::brokers::kafka().await);
    let certs = Certs::make();
    let tls = with_client(trusting(&certs), &certs.client());
    // librdkafka takes every setting (it checks them when the client is made)
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", kafka.brokers());
    for (k, v) in tls.kafka_settings().expect("settings") {
        config.set(k, v);
    }
    let made: Result<rdkafka::producer::BaseProducer, _> = config.create();
    made.expect("librdkafka built with OpenSSL takes the TLS settings");

    let topic = unique_table("tls_kafka");
    kafka.create_topic(&topic, 1).await;
    let plain = Consumer::new(kafka.brokers(), topic.clone(), topic.clone());
    let mut made = vec![topic.clone(), plain.dead_letter_topic()];
    made.extend(plain.retry_topics());
    let _cleanup = idem_tests::brokers::DeleteTopics::new(made);
    let consumer = Consumer::new(kafka.brokers(), topic.clone(), topic.clone())
        .tls(tls.clone())
        .set("socket.connection.setup.timeout.ms", "2000");
    let failed = tokio::time::timeout(Duration::from_secs(60), consumer.declare())
        .await
        .expect("an answer within 60 s")
        .expect_err("a plain-text broker");
    assert!(failed.to_string().contains("brokers are down"), "{failed}");
    // the same topic in plain text is there
    plain.declare().await.expect("declared in plain text");
    // a server name librdkafka cannot check: refused by run at once, not
    // retried
    let named = Consumer::new(kafka.brokers(), topic.clone(), topic.clone())
        .tls(tls.clone().server_name(SERVER_NAME).expect("a name"));
    let run = tokio::time::timeout(
        Duration::from_secs(10),
        named.run(
            |_: Points| async { Ok::<_, idem_runtime::Error<AppError>>(Outcome::Executed(0)) },
            idem_runtime::consume::CancellationToken::new(),
        ),
    )
    .await
    .expect("run refuses at once")
    .expect_err("a server name on Kafka");
    assert!(
        run.to_string().contains("cannot verify a server name"),
        "{run}"
    );
    let dead = DeadLetters::connect_tls(kafka.brokers(), &plain.dead_letter_topic(), &tls).await;
    assert!(
        dead.is_err(),
        "dead letters reached over TLS on a plain-text broker"
    );
}
