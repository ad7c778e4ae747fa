//! The HTTP suite's scenarios, each generic over an [`HttpFixture`].

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::http::{Fingerprint, Idempotency, InFlight, recorded_with_server_errors};
use idem_tests::{HttpClient, Reply, Server};
use serde_json::json;

use super::{App, HttpFixture};

const DAY: Duration = Duration::from_secs(86_400);
const DRAFT_KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

/// The route served, and a client of it.
async fn serve<F: HttpFixture>(
    fx: &Arc<F>,
    route: Idempotency,
    pad: usize,
) -> (Arc<App>, Server, HttpClient) {
    let app = Arc::new(App::default());
    let server = Server::start(fx.router(route, &app, pad)).await;
    let client = HttpClient::new(server.addr);
    (app, server, client)
}

fn route() -> Idempotency {
    Idempotency::unscoped("http_orders", DAY)
}

/// `POST /orders` with `key` (quoted, as the draft writes it) and extra
/// headers.
async fn post(c: &HttpClient, key: &str, order: &str, headers: &[(&str, &str)]) -> Reply {
    let quoted = format!("\"{key}\"");
    let mut all = vec![
        ("idempotency-key", quoted.as_str()),
        ("content-type", "application/json"),
    ];
    all.extend_from_slice(headers);
    c.send(
        "POST",
        "/orders",
        &all,
        json!({ "order": order }).to_string(),
    )
    .await
    .expect("the server answers")
}

fn title(r: &Reply) -> String {
    r.json()["title"].as_str().unwrap_or_default().to_owned()
}

pub(crate) async fn the_drafts_examples<F: HttpFixture>(fx: Arc<F>) {
    let (app, _server, c) = serve(&fx, route(), 0).await;
    let first = post(&c, DRAFT_KEY, "o-1", &[]).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.replayed());
    assert_eq!(first.json()["key"], DRAFT_KEY, "the handler gets the key");
    assert_eq!(
        first.json()["downstream"],
        format!("36:{DRAFT_KEY}"),
        "unscoped, the key alone is passed on"
    );
    let retry = post(&c, DRAFT_KEY, "o-1", &[]).await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.body, first.body, "the recorded body, byte for byte");
    assert_eq!(
        retry.header("location"),
        Some("/orders/o-1"),
        "a recorded header"
    );
    assert_eq!(
        retry.header("x-run"),
        None,
        "a header the route does not record"
    );
    assert_eq!(fx.effects(&app, "o-1").await, 1);

    // No key: 400, with the draft's problem.
    let missing = c
        .send(
            "POST",
            "/orders",
            &[("content-type", "application/json")],
            json!({"order": "o-2"}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(title(&missing), "Idempotency-Key is missing");
    // The key with another payload: 422.
    let reused = post(&c, DRAFT_KEY, "o-other", &[]).await;
    assert_eq!(reused.status, 422, "{}", reused.text());
    assert_eq!(title(&reused), "Idempotency-Key is already used");
    assert_eq!(fx.effects(&app, "o-other").await, 0);
    // Malformed keys: 400, nothing run.
    let long = format!("\"{}\"", "k".repeat(256));
    for bad in ["\"\"", "\"open", long.as_str(), "a b", "\"a\";p=1"] {
        let r = c
            .send(
                "POST",
                "/orders",
                &[("idempotency-key", bad)],
                json!({"order": "o-bad"}).to_string(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{bad:?}: {}", r.text());
        assert_eq!(title(&r), "Idempotency-Key is malformed", "{bad:?}");
    }
    let two = c
        .send(
            "POST",
            "/orders",
            &[("idempotency-key", "a"), ("idempotency-key", "b")],
            json!({"order": "o-bad"}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(two.status, 400);
    assert_eq!(app.runs("o-bad"), 0);
    assert_eq!(fx.effects(&app, "o-1").await, 1);
}

/// Eight clients send one key at once while the first request runs.
async fn together<F: HttpFixture>(
    fx: &Arc<F>,
    route: Idempotency,
    order: &str,
) -> (Arc<App>, Vec<Reply>) {
    let (app, _server, c) = serve(fx, route, 0).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let c = c.clone();
        let order = order.to_owned();
        tasks.push(tokio::spawn(async move {
            post(&c, "k-together", &order, &[("x-sleep-ms", "300")]).await
        }));
    }
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.expect("the client task"));
    }
    (app, replies)
}

pub(crate) async fn concurrent_retries_run_once<F: HttpFixture>(fx: Arc<F>) {
    let (app, replies) = together(&fx, route(), "o-race").await;
    assert_eq!(
        fx.effects(&app, "o-race").await,
        1,
        "one effect for eight requests"
    );
    let fresh: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == 201 && !r.replayed())
        .collect();
    assert_eq!(
        fresh.len(),
        1,
        "one request ran: {:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    for r in &replies {
        match r.status {
            201 => assert_eq!(r.body, fresh[0].body, "a replay is the first's response"),
            409 => {
                assert_eq!(
                    title(r),
                    "A request is outstanding for this Idempotency-Key"
                );
                assert!(r.header("retry-after").is_some());
            }
            other => panic!("a retry got {other}: {}", r.text()),
        }
    }
    if fx.mode().racing_retry_waits() {
        // The first commits long before any lock timeout: every retry
        // waited on the key's row and gets the replay, none a `409`.
        assert!(
            replies.iter().all(|r| r.status == 201),
            "{:?}",
            replies.iter().map(|r| r.status).collect::<Vec<_>>()
        );
    }
    let runs = app.runs("o-race");
    if fx.mode().racing_retry_runs_handler() {
        assert!((1..=8).contains(&runs), "{runs}");
    } else {
        assert_eq!(runs, 1, "only the first request ran its handler");
    }
}

pub(crate) async fn concurrent_retries_wait_for_the_first<F: HttpFixture>(fx: Arc<F>) {
    let route = route().in_flight(InFlight::Wait(Duration::from_secs(5)));
    let (app, replies) = together(&fx, route, "o-wait").await;
    assert_eq!(fx.effects(&app, "o-wait").await, 1);
    for r in &replies {
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(
            r.body, replies[0].body,
            "every client gets the one response"
        );
    }
    assert_eq!(replies.iter().filter(|r| !r.replayed()).count(), 1);
}

pub(crate) async fn keys_are_scoped_by_the_caller<F: HttpFixture>(fx: Arc<F>) {
    let route = Idempotency::scoped_by("http_orders", DAY, |parts| {
        parts
            .headers
            .get("x-account")?
            .to_str()
            .ok()
            .map(str::to_owned)
    });
    let (app, _server, c) = serve(&fx, route, 0).await;
    let alice = post(&c, "k-1", "o-scoped", &[("x-account", "alice")]).await;
    let bob = post(&c, "k-1", "o-scoped", &[("x-account", "bob")]).await;
    assert_eq!((alice.status, bob.status), (201, 201));
    assert!(
        !alice.replayed() && !bob.replayed(),
        "each caller's key is its own"
    );
    assert_eq!(alice.json()["caller"], "alice");
    assert_eq!(bob.json()["caller"], "bob");
    // Both sent `k-1`; the key each handler passes on to a provider the
    // server calls under one account is its caller's own.
    assert_eq!(
        (&alice.json()["key"], &bob.json()["key"]),
        (&json!("k-1"), &json!("k-1"))
    );
    let downstream = |r: &Reply| {
        r.json()["downstream"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(downstream(&alice), "5:alice|3:k-1");
    assert_eq!(downstream(&bob), "3:bob|3:k-1");
    // A scope holding a space (or anything but visible ASCII): the stored
    // key's digest, which fits any header.
    let zoe = post(&c, "k-1", "o-scoped", &[("x-account", "zoe smith")]).await;
    assert_eq!(zoe.status, 201, "{}", zoe.text());
    let zoe = downstream(&zoe);
    assert!(zoe.starts_with("#sha256:") && zoe.len() == 72, "{zoe}");
    let again = post(&c, "k-1", "o-scoped", &[("x-account", "bob")]).await;
    assert!(again.replayed());
    assert_eq!(
        again.json()["caller"],
        "bob",
        "bob gets his own response back"
    );
    let nobody = post(&c, "k-1", "o-scoped", &[]).await;
    assert_eq!(nobody.status, 401);
    assert_eq!(fx.effects(&app, "o-scoped").await, 3);
}

pub(crate) async fn statuses_are_recorded_or_released_by_class<F: HttpFixture>(fx: Arc<F>) {
    let (app, _server, c) = serve(&fx, route(), 0).await;
    // A client error the handler produced is its answer: recorded.
    for (key, status) in [("k-402", "402"), ("k-404", "404")] {
        let order = format!("o-{status}");
        let first = post(&c, key, &order, &[("x-status", status)]).await;
        assert_eq!(first.status.to_string(), status);
        let retry = post(&c, key, &order, &[]).await;
        assert_eq!(retry.status.to_string(), status, "{}", retry.text());
        assert!(retry.replayed());
        assert_eq!(fx.effects(&app, &order).await, 1);
    }
    // A server error, and the client errors that ask for a retry, release
    // the key; in transaction mode the handler's write rolls back.
    for (key, status) in [("k-500", "500"), ("k-503", "503"), ("k-429", "429")] {
        let order = format!("o-{status}");
        let first = post(&c, key, &order, &[("x-status", status)]).await;
        assert_eq!(first.status.to_string(), status);
        assert!(!first.replayed());
        let after_first = if fx.mode().rolls_back() { 0 } else { 1 };
        assert_eq!(fx.effects(&app, &order).await, after_first, "{status}");
        let retry = post(&c, key, &order, &[]).await;
        assert_eq!(retry.status, 201, "the retry runs: {}", retry.text());
        assert!(!retry.replayed());
        assert_eq!(fx.effects(&app, &order).await, after_first + 1, "{status}");
        assert!(post(&c, key, &order, &[]).await.replayed());
    }
}

/// A route that records the handler's server errors (Stripe's choice):
/// every retry gets the first 5xx back, and in transaction mode without
/// the handler's write, which rolls back; `503` is still released.
pub(crate) async fn server_errors_recorded_on_request<F: HttpFixture>(fx: Arc<F>) {
    let (app, _server, c) = serve(&fx, route().recorded(recorded_with_server_errors), 0).await;
    for (key, status) in [("k-500", "500"), ("k-502", "502")] {
        let order = format!("o-{status}");
        let first = post(&c, key, &order, &[("x-status", status)]).await;
        assert_eq!(first.status.to_string(), status);
        assert!(!first.replayed());
        // Transaction mode records the response without the write.
        let effects = if fx.mode().rolls_back() { 0 } else { 1 };
        assert_eq!(fx.effects(&app, &order).await, effects, "{status}");
        for _ in 0..2 {
            // Unscripted, a run would answer 201: the retry gets the 500.
            let retry = post(&c, key, &order, &[]).await;
            assert_eq!(retry.status.to_string(), status, "{}", retry.text());
            assert!(retry.replayed(), "{status}: {}", retry.text());
            assert_eq!(retry.text(), first.text(), "the first response, whole");
            assert_eq!(retry.header("location"), first.header("location"));
            assert_eq!(fx.effects(&app, &order).await, effects, "{status}");
        }
        if !fx.mode().retry_runs_handler() {
            assert_eq!(app.runs(&order), 1, "{status}: no retry ran the handler");
        }
    }
    // 503 asks for a retry: released, as by default.
    let first = post(&c, "k-503", "o-503", &[("x-status", "503")]).await;
    assert_eq!(first.status, 503);
    let retry = post(&c, "k-503", "o-503", &[]).await;
    assert_eq!(retry.status, 201, "the retry runs: {}", retry.text());
    assert!(!retry.replayed());
    let effects = if fx.mode().rolls_back() { 1 } else { 2 };
    assert_eq!(fx.effects(&app, "o-503").await, effects);
    // What the handler answers below 500 is recorded as by default, in
    // transaction mode with its write.
    let first = post(&c, "k-402", "o-402", &[("x-status", "402")]).await;
    assert_eq!(first.status, 402);
    assert!(post(&c, "k-402", "o-402", &[]).await.replayed());
    assert_eq!(fx.effects(&app, "o-402").await, 1);
}

pub(crate) async fn other_methods_pass_through<F: HttpFixture>(fx: Arc<F>) {
    let (app, _server, c) = serve(&fx, route(), 0).await;
    for _ in 0..2 {
        let r = c
            .send(
                "GET",
                "/orders",
                &[("idempotency-key", "k-get")],
                json!({"order": "o-get"}).to_string(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 201);
        assert!(!r.replayed());
        assert_eq!(
            r.json()["key"],
            serde_json::Value::Null,
            "the layer took no part"
        );
    }
    assert_eq!(app.runs("o-get"), 2);
}

pub(crate) async fn sizes_are_bounded<F: HttpFixture>(fx: Arc<F>) {
    let route = route().max_request_body(64).max_stored_body(256);
    let (app, _server, c) = serve(&fx, route, 300).await;
    let big = json!({ "order": "o-big-request", "filler": "x".repeat(100) }).to_string();
    let r = c
        .send("POST", "/orders", &[("idempotency-key", "k-413")], big)
        .await
        .unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(app.runs("o-big-request"), 0);
    // The handler pads its bodies past what the route records.
    let first = post(&c, "k-big", "o-big", &[]).await;
    assert_eq!(first.status, 201);
    assert!(
        first.body.len() > 300,
        "the first request gets the whole body"
    );
    let retry = post(&c, "k-big", "o-big", &[]).await;
    assert_eq!(retry.status, 201);
    assert!(retry.body.is_empty(), "{}", retry.text());
    assert_eq!(retry.header("idempotent-replayed"), Some("body-not-stored"));
    assert_eq!(retry.header("location"), Some("/orders/o-big"));
    assert_eq!(fx.effects(&app, "o-big").await, 1);
}

pub(crate) async fn optional_keys_and_the_fingerprint<F: HttpFixture>(fx: Arc<F>) {
    let route = route()
        .required(false)
        .fingerprint(Fingerprint::default().without_body());
    let (app, _server, c) = serve(&fx, route, 0).await;
    for _ in 0..2 {
        let r = c
            .send(
                "POST",
                "/orders",
                &[],
                json!({"order": "o-keyless"}).to_string(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 201);
        assert!(!r.replayed());
    }
    assert_eq!(
        app.runs("o-keyless"),
        2,
        "without a key the handler runs each time"
    );
    let first = post(&c, "k-fp", "o-fp-1", &[]).await;
    let other_body = post(&c, "k-fp", "o-fp-2", &[]).await;
    assert_eq!(other_body.status, 201);
    assert!(
        other_body.replayed(),
        "the body is not in the fingerprint: {}",
        other_body.text()
    );
    assert_eq!(other_body.body, first.body);
    assert_eq!(fx.effects(&app, "o-fp-1").await, 1);
    assert_eq!(fx.effects(&app, "o-fp-2").await, 0);
    if !fx.mode().retry_runs_handler() {
        assert_eq!(app.runs("o-fp-2"), 0);
    }
}

/// What a client that gave up on its first request gets by retrying it
/// with the same key: every `409` while the first runs on (or `408` from a
/// timeout layer, when the retry waits on the first's lock), then the
/// first answer that is neither (within 10 s).
async fn retried_until_answered(server: &Server, key: &str, order: &str) -> (usize, Reply) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut conflicts = 0;
    loop {
        // A client of its own: nothing of the first connection is reused.
        let c = HttpClient::new(server.addr);
        let r = post(&c, key, order, &[]).await;
        if r.status != 409 && r.status != 408 {
            return (conflicts, r);
        }
        conflicts += 1;
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {} after 10 s: {}",
            r.status,
            r.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The handler takes effect, then waits 1.2 s for its provider; the
/// client gives up after 300 ms and closes its connection, which drops the
/// request's future in the server. The call goes on on its own task: the
/// effect happens once, the response is recorded, and the retry gets it.
pub(crate) async fn a_client_that_hangs_up_does_not_cut_the_handler<F: HttpFixture>(fx: Arc<F>) {
    let (app, server, _c) = serve(&fx, route(), 0).await;
    let impatient = HttpClient::new(server.addr);
    let first = tokio::time::timeout(
        Duration::from_millis(300),
        post(
            &impatient,
            "k-hang-up",
            "o-hang-up",
            &[("x-sleep-ms", "1200")],
        ),
    )
    .await;
    assert!(first.is_err(), "the client gave up before the answer");
    drop(impatient);
    answered_once(&fx, &app, &server, "k-hang-up", "o-hang-up").await;
}

/// The retries of a request whose first run went on without its client:
/// its effect once, and the first run's recorded response for the retry.
async fn answered_once<F: HttpFixture>(
    fx: &Arc<F>,
    app: &App,
    server: &Server,
    key: &str,
    order: &str,
) {
    if fx.mode().racing_retry_runs_handler() {
        // Claiming last, a retry racing the first run would run the
        // handler itself: the retry comes once the first run is over.
        app.calls_finished().await;
    }
    let (_, retry) = retried_until_answered(server, key, order).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(
        retry.replayed(),
        "the first run's response: {}",
        retry.text()
    );
    assert_eq!(retry.json()["run"], 1, "{}", retry.text());
    if !fx.mode().retry_runs_handler() {
        // Claiming last, the retry of a recorded key runs the handler and
        // rolls it back: its effect is the committed rows alone.
        assert_eq!(app.runs(order), 1, "the handler ran once");
    }
    app.calls_finished().await;
    assert_eq!(fx.effects(app, order).await, 1, "the effect happened once");
}

/// tower's timeout layer around the route drops the request's future after
/// 300 ms (and answers 408); the handler, 1.2 s long, goes on to its
/// recorded response, which the retry gets.
pub(crate) async fn a_timeout_layer_does_not_cut_the_handler<F: HttpFixture>(fx: Arc<F>) {
    use axum::error_handling::HandleErrorLayer;
    use tower::ServiceBuilder;

    let app = Arc::new(App::default());
    let router = fx.router(route(), &app, 0).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                http::StatusCode::REQUEST_TIMEOUT
            }))
            .timeout(Duration::from_millis(300)),
    );
    let server = Server::start(router).await;
    let c = HttpClient::new(server.addr);
    let first = post(&c, "k-timeout", "o-timeout", &[("x-sleep-ms", "1200")]).await;
    assert_eq!(first.status, 408, "the timeout layer answered");
    answered_once(&fx, &app, &server, "k-timeout", "o-timeout").await;
}

/// A route with a 200 ms grace and a 1 s lease; the handler takes effect,
/// then takes 2 s, and its client gives up after 100 ms. 200 ms after the
/// client went away the call is dropped, not 2 s later. In transaction
/// mode its writes roll back, and the retry runs the handler afresh. In
/// lease mode its effect stays and its key is held a whole lease from the
/// drop: retries get `409` until then, and the next one runs the handler
/// again (the window a downstream key closes).
pub(crate) async fn a_call_past_its_grace_is_dropped<F: HttpFixture>(fx: Arc<F>) {
    let route = route()
        .grace(Duration::from_millis(200))
        .lease_duration(Duration::from_secs(1));
    let (app, server, _c) = serve(&fx, route, 0).await;
    let impatient = HttpClient::new(server.addr);
    let first = tokio::time::timeout(
        Duration::from_millis(100),
        post(&impatient, "k-grace", "o-grace", &[("x-sleep-ms", "2000")]),
    )
    .await;
    assert!(first.is_err(), "the client gave up before the answer");
    drop(impatient);
    let gone = std::time::Instant::now();
    app.calls_finished().await;
    assert!(
        gone.elapsed() < Duration::from_millis(1_500),
        "dropped once its grace ran out, not after the handler: {:?}",
        gone.elapsed()
    );
    assert_eq!(app.runs("o-grace"), 1);
    if fx.mode().rolls_back() {
        assert_eq!(
            fx.effects(&app, "o-grace").await,
            0,
            "its writes rolled back"
        );
        let retry = post(&HttpClient::new(server.addr), "k-grace", "o-grace", &[]).await;
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert!(!retry.replayed(), "nothing was recorded: {}", retry.text());
        assert_eq!(fx.effects(&app, "o-grace").await, 1);
    } else {
        let held = post(&HttpClient::new(server.addr), "k-grace", "o-grace", &[]).await;
        assert_eq!(held.status, 409, "the key is held: {}", held.text());
        let (_, retry) = retried_until_answered(&server, "k-grace", "o-grace").await;
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert!(!retry.replayed(), "nothing was recorded: {}", retry.text());
        assert!(
            gone.elapsed() >= Duration::from_millis(1_150),
            "held a whole lease from the drop: {:?}",
            gone.elapsed()
        );
        assert_eq!(app.runs("o-grace"), 2, "run again once the lease ran out");
    }
}
