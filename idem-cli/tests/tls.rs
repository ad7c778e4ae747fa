//! The `idem` binary over TLS, against servers of the tests' own that take
//! TLS only (`idem_tests::tls`): `stats` and `dead list` work with
//! `--tls-ca` (or a URL that asks for TLS by itself), mutual TLS with
//! `--tls-cert`/`--tls-key`, another name with `--tls-server-name`; a
//! certificate that does not verify fails with the reason (unknown CA,
//! wrong host name, expired), and a plain-text URL to a TLS-only server
//! with the server's refusal and what to use instead.

mod common;

use std::time::Duration;

use common::{ORDERS, ORDERS_SPEC, complete, idem, key};
use idem_runtime::tls::Tls;
use idem_runtime::{MemoryStore, idempotent};
use idem_tests::tls::{
    Certs, MTLS_USER, SERVER_NAME, TlsMariaDb, TlsNats, TlsPostgres, TlsRabbitMq, TlsRedis, started,
};
use idem_tests::{or_skip, unique_table};

fn path(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// Runs `idem args` off the runtime's threads.
async fn run(args: &[&str]) -> common::Run {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        idem(&args)
    })
    .await
    .expect("the idem binary ran")
}

/// The one line of a run that fails with exit 1 (the store or broker).
async fn refused(args: &[&str]) -> String {
    run(args).await.fails(1)
}

/// `idem --json <args> stats` counts the completed record of `cli_orders`.
async fn stats_show_the_record(args: &[&str]) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    all.push("stats");
    let stats = run(&all).await.json();
    assert!(stats.to_string().contains(ORDERS), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls() {
    let certs = Certs::make();
    let pg = or_skip!(started("PostgreSQL over TLS", TlsPostgres::start(&certs)));
    let tls = Tls::new().ca_file(certs.ca()).expect("the CA");
    let table = unique_table("cli_tls_pg");
    let store = idem_runtime::PgStore::connect_tls(&pg.url(""), &tls)
        .await
        .expect("TLS")
        .with_table(&table)
        .expect("a table");
    store.migrate().await.expect("migrated");
    complete(&store, &ORDERS_SPEC, &key("o-1", "apple"), "1").await;
    let (ca, other) = (path(&certs.ca()), path(&certs.other_ca()));
    let client = certs.client();
    let (cert, client_key) = (path(&client.cert), path(&client.key));
    let url = pg.url("");

    stats_show_the_record(&["--store", &url, "--table", &table, "--tls-ca", &ca]).await;
    let by_url = pg.url(&format!("sslmode=verify-full&sslrootcert={ca}"));
    stats_show_the_record(&["--store", &by_url, "--table", &table]).await;
    let mtls = pg.url_as(MTLS_USER, "127.0.0.1", "");
    stats_show_the_record(&[
        "--store",
        &mtls,
        "--table",
        &table,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &client_key,
    ])
    .await;

    let line = refused(&["--store", &url, "--tls-ca", &other, "stats"]).await;
    assert!(line.contains("(unknown CA)"), "{line}");
    let elsewhere = pg.url_as("postgres", "127.0.0.2", "");
    let line = refused(&["--store", &elsewhere, "--tls-ca", &ca, "stats"]).await;
    assert!(line.contains("(wrong host name)"), "{line}");
    let plain = pg.url("sslmode=disable");
    let line = refused(&["--store", &plain, "stats"]).await;
    assert!(
        line.contains("no encryption") && line.contains("the server takes TLS only"),
        "{line}"
    );
    let line = refused(&["--store", &mtls, "--tls-ca", &ca, "stats"]).await;
    assert!(
        line.contains("requires a valid client certificate"),
        "{line}"
    );
    let line = run(&[
        "--store",
        &url,
        "--tls-ca",
        &ca,
        "--tls-server-name",
        SERVER_NAME,
        "stats",
    ])
    .await
    .fails(1);
    assert!(line.contains("cannot verify a server name"), "{line}");
    let line = run(&["--store", &url, "--tls-cert", &cert, "stats"])
        .await
        .fails(2);
    assert!(line.contains("--tls-key"), "{line}");
    let line = run(&["--store", &url, "--tls-ca", "/nowhere/ca.pem", "stats"])
        .await
        .fails(2);
    assert!(line.contains("/nowhere/ca.pem"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_over_tls() {
    let certs = Certs::make();
    let db = or_skip!(started("MariaDB over TLS", TlsMariaDb::start(&certs)));
    let tls = Tls::new().ca_file(certs.ca()).expect("the CA");
    let table = unique_table("cli_tls_my");
    let store = idem_runtime::MySqlStore::connect_tls(&db.url("idem", ""), &tls)
        .await
        .expect("TLS")
        .with_table(&table)
        .expect("a table");
    store.migrate().await.expect("migrated");
    complete(&store, &ORDERS_SPEC, &key("o-1", "apple"), "1").await;
    let (ca, other) = (path(&certs.ca()), path(&certs.other_ca()));
    let client = certs.client();
    let (cert, client_key) = (path(&client.cert), path(&client.key));
    let url = db.url("idem", "");

    stats_show_the_record(&["--store", &url, "--table", &table, "--tls-ca", &ca]).await;
    let mtls = db.url(MTLS_USER, "");
    stats_show_the_record(&[
        "--store",
        &mtls,
        "--table",
        &table,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &client_key,
    ])
    .await;
    let line = refused(&["--store", &url, "--tls-ca", &other, "stats"]).await;
    assert!(line.contains("(unknown CA)"), "{line}");
    // MariaDB refuses a plain-text login as it would a wrong password
    let plain = db.url("idem", "ssl-mode=DISABLED");
    let line = refused(&["--store", &plain, "stats"]).await;
    assert!(line.contains("Access denied for user 'idem'"), "{line}");
    let line = refused(&["--store", &mtls, "--tls-ca", &ca, "stats"]).await;
    assert!(
        line.contains("Access denied for user 'idem_mtls'"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls() {
    let certs = Certs::make();
    let redis = or_skip!(started("Redis over TLS", TlsRedis::start(&certs)));
    let tls = Tls::new().ca_file(certs.ca()).expect("the CA");
    let prefix = unique_table("cli_tls_redis");
    let store = idem_runtime::RedisStore::connect_tls(&redis.url(), &tls)
        .await
        .expect("TLS")
        .with_prefix(&prefix)
        .expect("a prefix");
    complete(&store, &ORDERS_SPEC, &key("o-1", "apple"), "1").await;
    let (ca, other) = (path(&certs.ca()), path(&certs.other_ca()));
    let client = certs.client();
    let (cert, client_key) = (path(&client.cert), path(&client.key));
    let url = redis.url();

    stats_show_the_record(&["--store", &url, "--prefix", &prefix, "--tls-ca", &ca]).await;
    let line = refused(&["--store", &url, "--tls-ca", &other, "stats"]).await;
    assert!(line.contains("(unknown CA)"), "{line}");
    let elsewhere = redis.url_as("rediss", "127.0.0.2");
    let line = refused(&["--store", &elsewhere, "--tls-ca", &ca, "stats"]).await;
    assert!(line.contains("(wrong host name)"), "{line}");
    let plain = redis.url_as("redis", "127.0.0.1");
    let line = refused(&["--store", &plain, "--tls-ca", &ca, "stats"]).await;
    assert!(line.contains("use `rediss://`"), "{line}");
    let line = refused(&["--store", &plain, "--timeout", "5", "stats"]).await;
    assert!(
        line.contains("if it takes TLS only, use rediss://"),
        "{line}"
    );

    let expired = or_skip!(started("Redis over TLS", TlsRedis::expired(&certs)));
    let line = refused(&["--store", &expired.url(), "--tls-ca", &ca, "stats"]).await;
    assert!(line.contains("has expired"), "{line}");

    let mutual = or_skip!(started("Redis over mutual TLS", TlsRedis::mutual(&certs)));
    let with_client = tls
        .clone()
        .client_identity_files(&client.cert, &client.key)
        .expect("a client certificate");
    let store = idem_runtime::RedisStore::connect_tls(&mutual.url(), &with_client)
        .await
        .expect("mutual TLS")
        .with_prefix(&prefix)
        .expect("a prefix");
    complete(&store, &ORDERS_SPEC, &key("o-1", "apple"), "1").await;
    let url = mutual.url();
    stats_show_the_record(&[
        "--store",
        &url,
        "--prefix",
        &prefix,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &client_key,
    ])
    .await;
    let line = refused(&["--store", &url, "--tls-ca", &ca, "stats"]).await;
    assert!(line.contains("asks for a client certificate"), "{line}");
}

#[derive(serde::Deserialize)]
struct Order {
    id: String,
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn cli_tls_take(msg: &Order) -> Result<usize, std::io::Error> {
    Ok(msg.id.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_over_tls() {
    use idem_runtime::consume::{CancellationToken, nats, rabbitmq};
    use idem_runtime::outbox::{Destination as _, MessageId, NatsDestination, Outgoing};
    let certs = Certs::make();
    let tls = Tls::new().ca_file(certs.ca()).expect("the CA");
    let (ca, other) = (path(&certs.ca()), path(&certs.other_ca()));

    // NATS: a message that does not decode, dead-lettered over TLS
    let server = or_skip!(started("NATS over TLS", TlsNats::start(&certs)));
    let stream = unique_table("CLI_TLS").to_uppercase();
    let subject = format!("idem.cli.{stream}");
    let consumer =
        nats::Consumer::new(server.url(), stream.clone(), subject.clone()).tls(tls.clone());
    consumer.declare().await.expect("declared over TLS");
    let to = NatsDestination::connect_tls(&server.url(), &tls)
        .await
        .expect("a publisher");
    let poison = Outgoing::for_test(
        MessageId::derive("cli", "tls", 0),
        &subject,
        b"not json".to_vec(),
    );
    to.publish(&poison).await.expect("published");
    let store = MemoryStore::new();
    let stop = CancellationToken::new();
    let running = tokio::spawn(consumer.run(
        move |msg: Order| {
            let store = store.clone();
            async move { cli_tls_take(&store, &msg).await }
        },
        stop.clone(),
    ));
    let url = server.url();
    let list = [
        "--json", "dead", "list", "--nats", &url, "--stream", &stream, "--tls-ca", &ca,
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let listing = run(&list).await.json();
        if listing["count"] == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dead letter: {listing}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    running.await.expect("the consumer").expect("stopped");
    let mut named = list.to_vec();
    named.extend(["--tls-server-name", SERVER_NAME]);
    assert_eq!(run(&named).await.json()["count"], 1);
    let line = refused(&[
        "dead", "list", "--nats", &url, "--stream", &stream, "--tls-ca", &other,
    ])
    .await;
    assert!(line.contains("(unknown CA)"), "{line}");
    let line = refused(&[
        "dead",
        "list",
        "--nats",
        &url,
        "--stream",
        &stream,
        "--tls-ca",
        &ca,
        "--tls-server-name",
        "other.idem.test",
    ])
    .await;
    assert!(line.contains("(wrong host name)"), "{line}");

    // RabbitMQ
    let broker = or_skip!(started("RabbitMQ over TLS", TlsRabbitMq::start(&certs)));
    let queue = unique_table("cli_tls");
    rabbitmq::Consumer::new(broker.url(), queue.clone())
        .tls(tls.clone())
        .declare()
        .await
        .expect("declared over TLS");
    let url = broker.url();
    let listing = run(&[
        "--json",
        "dead",
        "list",
        "--rabbitmq",
        &url,
        "--queue",
        &queue,
        "--tls-ca",
        &ca,
    ])
    .await
    .json();
    assert_eq!(listing["count"], 0, "{listing}");
    let line = refused(&[
        "dead",
        "list",
        "--rabbitmq",
        &url,
        "--queue",
        &queue,
        "--tls-ca",
        &other,
    ])
    .await;
    assert!(line.contains("(unknown CA)"), "{line}");
    let plain = broker.url_as("amqp");
    let line = refused(&[
        "dead",
        "list",
        "--rabbitmq",
        &plain,
        "--queue",
        &queue,
        "--tls-ca",
        &ca,
    ])
    .await;
    assert!(line.contains("use `amqps://`"), "{line}");
    let line = refused(&["dead", "list", "--rabbitmq", &plain, "--queue", &queue]).await;
    assert!(
        line.contains("if its listener takes TLS, use amqps://"),
        "{line}"
    );
}
