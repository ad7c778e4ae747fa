//! The `idem` binary over TLS, against servers of the tests' own that take
//! TLS only (`idem_tests::tls`): `stats` and `dead list` work with
//! `--tls-ca` (or a URL that asks for TLS by itself), mutual TLS with
//! `--tls-cert`/`--tls-key`; a certificate that does not verify fails with
//! the reason (unknown CA, wrong host name, expired), and a plain-text URL
//! to a TLS-only server with the server's refusal.

mod common;

use common::{ORDERS, ORDERS_SPEC, complete, idem, key};
use idem_runtime::tls::Tls;
use idem_tests::tls::{
    Certs, MTLS_USER, TlsMariaDb, TlsNats, TlsPostgres, TlsRabbitMq, TlsRedis, started,
};
use idem_tests::{or_skip, unique_table};

fn path(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// Runs `idem` off the runtime's threads.
async fn run(args: Vec<String>) -> common::Run {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        idem(&args)
    })
    .await
    .expect("the idem binary ran")
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// `idem --store <url> [tls...] --json stats` counts one completed record
/// of `cli_orders`.
async fn stats_show_the_record(url: &str, tls: &[&str]) {
    let mut args = strings(&["--store", url, "--json"]);
    args.extend(strings(tls));
    args.push("stats".into());
    let stats = run(args).await.json();
    let text = stats.to_string();
    assert!(text.contains(ORDERS), "{text}");
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
    let ca = path(&certs.ca());

    stats_show_the_record(&pg.url(""), &["--table", &table, "--tls-ca", &ca]).await;
    let by_url = pg.url(&format!("sslmode=verify-full&sslrootcert={ca}"));
    stats_show_the_record(&by_url, &["--table", &table]).await;
    let client = certs.client();
    stats_show_the_record(
        &pg.url_as(MTLS_USER, "127.0.0.1", ""),
        &[
            "--table",
            &table,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &path(&client.cert),
            "--tls-key",
            &path(&client.key),
        ],
    )
    .await;

    let other = path(&certs.other_ca());
    let line = run(strings(&[
        "--store",
        &pg.url(""),
        "--tls-ca",
        &other,
        "stats",
    ]))
    .await
    .fails(1);
    assert!(line.contains("(unknown CA)"), "{line}");
    let line = run(strings(&[
        "--store",
        &pg.url_as("postgres", "127.0.0.2", ""),
        "--tls-ca",
        &ca,
        "stats",
    ]))
    .await
    .fails(1);
    assert!(line.contains("(wrong host name)"), "{line}");
    let line = run(strings(&["--store", &pg.url("sslmode=disable"), "stats"]))
        .await
        .fails(1);
    assert!(line.contains("no encryption"), "{line}");
    let line = run(strings(&[
        "--store",
        &pg.url(""),
        "--tls-cert",
        &path(&client.cert),
        "stats",
    ]))
    .await
    .fails(2);
    assert!(line.contains("--tls-key"), "{line}");
    let line = run(strings(&[
        "--store",
        &pg.url(""),
        "--tls-ca",
        "/nowhere/ca.pem",
        "stats",
    ]))
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
    let ca = path(&certs.ca());
    stats_show_the_record(&db.url("idem", ""), &["--table", &table, "--tls-ca", &ca]).await;
    let client = certs.client();
    stats_show_the_record(
        &db.url(MTLS_USER, ""),
        &[
            "--table",
            &table,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &path(&client.cert),
            "--tls-key",
            &path(&client.key),
        ],
    )
    .await;
    let line = run(strings(&[
        "--store",
        &db.url("idem", ""),
        "--tls-ca",
        &path(&certs.other_ca()),
        "stats",
    ]))
    .await
    .fails(1);
    assert!(line.contains("(unknown CA)"), "{line}");
    run(strings(&[
        "--store",
        &db.url("idem", "ssl-mode=DISABLED"),
        "stats",
    ]))
    .await
    .fails(1);
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
    let ca = path(&certs.ca());
    stats_show_the_record(&redis.url(), &["--prefix", &prefix, "--tls-ca", &ca]).await;

    let line = run(strings(&[
        "--store",
        &redis.url(),
        "--tls-ca",
        &path(&certs.other_ca()),
        "stats",
    ]))
    .await
    .fails(1);
    assert!(line.contains("(unknown CA)"), "{line}");
    let line = run(strings(&[
        "--store",
        &redis.url_as("rediss", "127.0.0.2"),
        "--tls-ca",
        &ca,
        "stats",
    ]))
    .await
    .fails(1);
    assert!(line.contains("(wrong host name)"), "{line}");
    let line = run(strings(&[
        "--store",
        &redis.url_as("redis", "127.0.0.1"),
        "--tls-ca",
        &ca,
        "stats",
    ]))
    .await
    .fails(1);
    assert!(line.contains("rediss://"), "{line}");
    run(strings(&[
        "--store",
        &redis.url_as("redis", "127.0.0.1"),
        "--timeout",
        "5",
        "stats",
    ]))
    .await
    .fails(1);

    let expired = or_skip!(started("Redis over TLS", TlsRedis::expired(&certs)));
    let line = run(strings(&[
        "--store",
        &expired.url(),
        "--tls-ca",
        &ca,
        "stats",
    ]))
    .await
    .fails(1);
    assert!(line.contains("has expired"), "{line}");

    let mutual = or_skip!(started("Redis over mutual TLS", TlsRedis::mutual(&certs)));
    let client = certs.client();
    let store = idem_runtime::RedisStore::connect_tls(
        &mutual.url(),
        &tls.clone()
            .client_identity_files(&client.cert, &client.key)
            .expect("a client certificate"),
    )
    .await
    .expect("mutual TLS")
    .with_prefix(&prefix)
    .expect("a prefix");
    complete(&store, &ORDERS_SPEC, &key("o-1", "apple"), "1").await;
    stats_show_the_record(
        &mutual.url(),
        &[
            "--prefix",
            &prefix,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &path(&client.cert),
            "--tls-key",
            &path(&client.key),
        ],
    )
    .await;
    run(strings(&[
        "--store",
        &mutual.url(),
        "--tls-ca",
        &ca,
        "stats",
    ]))
    .await
    .fails(1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_over_tls() {
    use idem_runtime::consume::{nats, rabbitmq};
    let certs = Certs::make();
    let tls = Tls::new().ca_file(certs.ca()).expect("the CA");
    let ca = path(&certs.ca());
    let other = path(&certs.other_ca());

    let server = or_skip!(started("NATS over TLS", TlsNats::start(&certs)));
    let stream = unique_table("CLI_TLS").to_uppercase();
    let consumer = nats::Consumer::new(server.url(), stream.clone(), format!("idem.cli.{stream}"))
        .tls(tls.clone());
    consumer.declare().await.expect("declared over TLS");
    let listing = run(strings(&[
        "--json",
        "dead",
        "list",
        "--nats",
        &server.url(),
        "--stream",
        &stream,
        "--tls-ca",
        &ca,
    ]))
    .await
    .json();
    assert_eq!(listing["count"], 0, "{listing}");
    let line = run(strings(&[
        "dead",
        "list",
        "--nats",
        &server.url(),
        "--stream",
        &stream,
        "--tls-ca",
        &other,
    ]))
    .await
    .fails(1);
    assert!(line.contains("(unknown CA)"), "{line}");

    let broker = or_skip!(started("RabbitMQ over TLS", TlsRabbitMq::start(&certs)));
    let queue = unique_table("cli_tls");
    let consumer = rabbitmq::Consumer::new(broker.url(), queue.clone()).tls(tls.clone());
    consumer.declare().await.expect("declared over TLS");
    let listing = run(strings(&[
        "--json",
        "dead",
        "list",
        "--rabbitmq",
        &broker.url(),
        "--queue",
        &queue,
        "--tls-ca",
        &ca,
    ]))
    .await
    .json();
    assert_eq!(listing["count"], 0, "{listing}");
    let line = run(strings(&[
        "dead",
        "list",
        "--rabbitmq",
        &broker.url(),
        "--queue",
        &queue,
        "--tls-ca",
        &other,
    ]))
    .await
    .fails(1);
    assert!(line.contains("(unknown CA)"), "{line}");
    let line = run(strings(&[
        "dead",
        "list",
        "--rabbitmq",
        &broker.url_as("amqp"),
        "--queue",
        &queue,
        "--tls-ca",
        &ca,
    ]))
    .await
    .fails(1);
    assert!(line.contains("amqps://"), "{line}");
}
