//! The monitoring of `observability/` on a live system: the `observability`
//! example (two idempotent handlers behind RabbitMQ consumers, a producer
//! with a few duplicates and failures, a network blip, then a duplicate
//! storm) runs as a child process, and a real Prometheus, started here on a
//! free port with a scrape and evaluation interval of 1 s, scrapes it with
//! the real `alerts.yml`. Every query of every dashboard panel returns data,
//! the duplicate-rate alert goes pending for the stormed handler only, and
//! the example shuts down cleanly on SIGTERM.
//!
//! Needs `prometheus` (Debian's package, 2.42) and RabbitMQ; skips without
//! them unless `IDEM_REQUIRE_SERVICES=1`. Builds the example first with
//! cargo (a no-op when it is built). Runs in about a minute.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_runtime::consume::{RETRY_DELAYS, rabbitmq};
use idem_tests::brokers::{DeleteQueues, amqp_url};
use idem_tests::{free_port, or_skip, unavailable};
use serde_json::Value;

/// When the example cuts its consumers' connections, and when its duplicate
/// storm starts (on the orders queue, handler `ship_order`).
const BLIP_AFTER_S: u64 = 4;
const STORM_AFTER_S: u64 = 14;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// `prometheus`, or `None` (after [`unavailable`]) when it is not installed.
fn prometheus() -> Option<PathBuf> {
    let program =
        PathBuf::from(std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into()));
    match Command::new(&program).arg("--version").output() {
        Ok(out) if out.status.success() => Some(program),
        Ok(out) => unavailable(
            "Prometheus",
            &program.display().to_string(),
            format!("--version exited with {}", out.status),
        ),
        Err(e) => unavailable(
            "Prometheus",
            &program.display().to_string(),
            format!("{e}; Debian: apt-get install --no-install-recommends prometheus"),
        ),
    }
}

/// Whether RabbitMQ answers (or `None`, after [`unavailable`]).
fn rabbitmq_up() -> Option<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let (conn, _channel) = idem_tests::brokers::amqp_channel().await?;
        let _ = conn.close(200, "probed".into()).await;
        Some(())
    })
}

/// Builds the example with the cargo and profile of this test binary and
/// returns its path.
fn build_example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    // <target>/<profile dir>/deps/<this test>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the profile's directory");
    let target_dir = profile_dir.parent().expect("the target directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let began = Instant::now();
    let status = Command::new(cargo)
        .current_dir(root())
        // The whole workspace's features, as `cargo test --workspace`
        // resolves them, so that the example reuses what the tests built.
        .args(["build", "--quiet", "--workspace"])
        .args([
            "--features",
            "idem-examples/rabbitmq",
            "--example",
            "observability",
        ])
        .arg("--profile")
        .arg(&profile)
        .arg("--target-dir")
        .arg(target_dir)
        .status()
        .expect("running cargo");
    assert!(
        status.success(),
        "building the observability example failed"
    );
    eprintln!(
        "the observability example is built ({:.1} s)",
        began.elapsed().as_secs_f64()
    );
    profile_dir.join("examples").join("observability")
}

/// A child process, stopped when dropped: SIGTERM, then SIGKILL after 10 s.
struct Process {
    child: Child,
    what: &'static str,
    log: PathBuf,
}

impl Process {
    fn spawn(what: &'static str, cmd: &mut Command, log: PathBuf) -> Process {
        let out = std::fs::File::create(&log).expect("a log file");
        let err = out.try_clone().expect("a log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        Process { child, what, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test, with the process's log, when it has exited.
    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited with {status}:\n{}", self.what, self.log());
        }
    }

    /// SIGTERM, and its exit status once it has stopped (SIGKILL after
    /// `grace`).
    fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(10));
    }
}

/// `text` percent-encoded for a URL's query.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A GET on 127.0.0.1:`port`: the status code and the body, or why not.
fn get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    // HTTP/1.0: the answer is not chunked and the connection closes after it.
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP answer: {text}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP status: {head}"))?;
    Ok((status, body.to_owned()))
}

/// A Prometheus API call's `data`.
fn api(port: u16, path: &str) -> Value {
    let (status, body) = get(port, path).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let v: Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"));
    assert!(
        status == 200 && v["status"] == "success",
        "GET {path}: {status} {body}"
    );
    v["data"].clone()
}

/// The instant vector of a PromQL query.
fn query(port: u16, promql: &str) -> Vec<Value> {
    let data = api(port, &format!("/api/v1/query?query={}", encode(promql)));
    assert_eq!(data["resultType"], "vector", "{promql}");
    data["result"].as_array().cloned().unwrap_or_default()
}

/// Whether a sample's value is a number (not NaN: a quantile of nothing).
fn finite(sample: &Value) -> bool {
    sample["value"][1]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok())
        .is_some_and(f64::is_finite)
}

/// The dashboard's expression with Grafana's variables given fixed values:
/// every handler and queue, a rate interval of 30 s.
fn instantiate(expr: &str) -> String {
    let mut q = expr.to_owned();
    for (var, value) in [
        ("__rate_interval", "30s"),
        ("__interval", "5s"),
        ("__range", "5m"),
        ("handler", ".*"),
        ("queue", ".*"),
    ] {
        q = q.replace(&format!("${{{var}}}"), value);
        q = q.replace(&format!("${var}"), value);
    }
    assert!(
        !q.contains('$'),
        "a variable the test does not know: {expr}"
    );
    q
}

/// (panel title, expression) of every query of the dashboard.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = root().join("observability/grafana-dashboard.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard"))
        .expect("the dashboard is JSON");
    let mut panels = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        panels.push(p.clone());
        if let Some(inner) = p["panels"].as_array() {
            panels.extend(inner.iter().cloned());
        }
    }
    let mut queries = Vec::new();
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                let title = format!("{} ({})", p["title"].as_str().unwrap_or("?"), t["refId"]);
                queries.push((title, expr.to_owned()));
            }
        }
    }
    queries
}

/// The dashboard's variables of type query, as (name, label, series).
fn dashboard_variables() -> Vec<(String, String, String)> {
    let path = root().join("observability/grafana-dashboard.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard"))
        .expect("the dashboard is JSON");
    let mut out = Vec::new();
    for v in d["templating"]["list"].as_array().expect("templating") {
        if v["type"] != "query" {
            continue;
        }
        // label_values(<series>, <label>)
        let q = v["query"]["query"].as_str().expect("a variable query");
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("a variable query the test does not know: {q}"));
        let (series, label) = inner.split_once(',').expect("label_values(series, label)");
        out.push((
            v["name"].as_str().unwrap_or("?").to_owned(),
            label.trim().to_owned(),
            series.trim().to_owned(),
        ));
    }
    out
}

/// The alerts Prometheus holds now (pending and firing).
fn alerts(port: u16) -> Vec<Value> {
    api(port, "/api/v1/alerts")["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn named<'a>(alerts: &'a [Value], name: &str) -> Vec<&'a Value> {
    alerts
        .iter()
        .filter(|a| a["labels"]["alertname"] == name)
        .collect()
}

/// Polls `check` every second until it gives `Some`, or fails the test
/// after `limit` with what `check` last said.
fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(v) => return v,
            Err(why) if Instant::now() > deadline => {
                panic!("{what}: not within {limit:?}: {why}")
            }
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

#[test]
fn prometheus_scrapes_the_example_and_the_dashboard_and_alerts_work() {
    let prometheus_bin = or_skip!(prometheus());
    or_skip!(rabbitmq_up());
    let example = build_example();
    let dir = tempfile::tempdir().expect("a temporary directory");

    // The queues of the run, removed at the end.
    let prefix = format!("idem_obs_{}", uuid::Uuid::new_v4().simple());
    let mut queues = Vec::new();
    for q in [format!("{prefix}_orders"), format!("{prefix}_points")] {
        let c = rabbitmq::Consumer::new(amqp_url(), q.as_str());
        queues.push(c.dead_letter_queue());
        queues.extend(RETRY_DELAYS.iter().map(|d| c.retry_queue(*d)));
        queues.push(q);
    }
    let _delete = DeleteQueues::new(queues);
    let metrics_port = free_port().expect("a free port");
    let prom_port = free_port().expect("a free port");

    // Prometheus first, scraping the example (once it is up) every second
    // with the real alerting rules: the example's clock starts after it.
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: idem\n    static_configs:\n      - targets: [\"127.0.0.1:{metrics_port}\"]\n",
            root().join("observability/alerts.yml").display()
        ),
    )
    .expect("writing the configuration");
    let mut prom = Process::spawn(
        "prometheus",
        Command::new(&prometheus_bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .arg("--log.level=warn"),
        dir.path().join("prometheus.log"),
    );
    wait_for("Prometheus is ready", Duration::from_secs(30), || {
        prom.assert_running();
        match get(prom_port, "/-/ready") {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    // The example, on queues of its own.
    let started = Instant::now();
    let mut app = Process::spawn(
        "the observability example",
        Command::new(&example)
            .env("AMQP_URL", amqp_url())
            .arg("--listen")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .args(["--prefix", &prefix])
            .args(["--blip-after", &format!("{BLIP_AFTER_S}s")])
            .args(["--storm-after", &format!("{STORM_AFTER_S}s")])
            // a bound, should this test be killed before it stops it
            .args(["--run-for", "180s"]),
        dir.path().join("example.log"),
    );
    wait_for(
        "the example serves /metrics",
        Duration::from_secs(30),
        || {
            app.assert_running();
            match get(metrics_port, "/metrics") {
                Ok((200, body)) if body.contains("idem_calls_total") => Ok(()),
                Ok((status, _)) => Err(format!("status {status}, or no idem_calls_total yet")),
                Err(e) => Err(e),
            }
        },
    );
    wait_for(
        "Prometheus has scraped the example",
        Duration::from_secs(20),
        || {
            let up = query(prom_port, r#"up{job="idem"}"#);
            match up.first() {
                Some(s) if s["value"][1] == "1" => Ok(()),
                other => Err(format!("up: {other:?}")),
            }
        },
    );
    let rules = api(prom_port, "/api/v1/rules");
    let loaded: Vec<&str> = rules["groups"][0]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(
        loaded.contains(&"IdemDuplicateRateHigh") && loaded.len() >= 5,
        "Prometheus loaded the rules {loaded:?}"
    );

    // Before the storm: the duplicate rate is low, and no alert on it.
    let calm_until = Duration::from_secs(STORM_AFTER_S - 2);
    while started.elapsed() < Duration::from_secs(BLIP_AFTER_S + 4) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        started.elapsed() < calm_until,
        "the test is too slow to look before the storm"
    );
    let calm = alerts(prom_port);
    assert!(
        named(&calm, "IdemDuplicateRateHigh").is_empty(),
        "a duplicate-rate alert before the storm: {calm:?}"
    );
    let ratio = query(
        prom_port,
        // (a handler without duplicates yet counts 0)
        r#"sum by (handler) (rate(idem_calls_total{result="duplicate"}[5m]) or 0 * rate(idem_calls_total{result="executed"}[5m])) / sum by (handler) (rate(idem_calls_total[5m]))"#,
    );
    let shares: Vec<(String, f64)> = ratio
        .iter()
        .map(|s| {
            let handler = s["metric"]["handler"].as_str().unwrap_or("?").to_owned();
            let share = s["value"][1].as_str().and_then(|v| v.parse().ok());
            (handler, share.unwrap_or(f64::NAN))
        })
        .collect();
    eprintln!("duplicate share before the storm: {shares:?}");
    assert_eq!(shares.len(), 2, "both handlers have calls: {ratio:?}");
    assert!(
        shares.iter().all(|(_, share)| *share < 0.25),
        "the duplicate share before the storm is under the alert's threshold: {shares:?}"
    );

    // The storm: IdemDuplicateRateHigh goes pending (its `for: 5m` would
    // take 5 minutes more to fire) for ship_order, not for award_points.
    let stormed = wait_for(
        "IdemDuplicateRateHigh pending for ship_order",
        Duration::from_secs(STORM_AFTER_S + 45).saturating_sub(started.elapsed()),
        || {
            app.assert_running();
            let now = alerts(prom_port);
            let dup = named(&now, "IdemDuplicateRateHigh");
            match dup.iter().find(|a| a["labels"]["handler"] == "ship_order") {
                Some(a) => Ok(((*a).clone(), now.clone())),
                None => Err(format!("alerts now: {now:?}")),
            }
        },
    );
    let (alert, all) = stormed;
    assert!(
        alert["state"] == "pending" || alert["state"] == "firing",
        "{alert}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(STORM_AFTER_S),
        "the alert came before the storm: {alert}"
    );
    eprintln!(
        "IdemDuplicateRateHigh {} for ship_order {:.1} s after the storm began, at a duplicate share of {}",
        alert["state"],
        started.elapsed().as_secs_f64() - STORM_AFTER_S as f64,
        alert["value"]
    );
    let for_points: Vec<_> = named(&all, "IdemDuplicateRateHigh")
        .into_iter()
        .filter(|a| a["labels"]["handler"] != "ship_order")
        .collect();
    assert!(
        for_points.is_empty(),
        "only ship_order storms: {for_points:?}"
    );
    // the workload's dead letters alert at once; the consumers settle
    assert!(
        !named(&all, "IdemDeadLetters").is_empty(),
        "the example dead-letters, so IdemDeadLetters is active: {all:?}"
    );
    assert!(
        named(&all, "IdemConsumerStalled").is_empty(),
        "the consumers settle all the time: {all:?}"
    );
    // a caller's timeout drops award_points bodies halfway, and nothing else
    // drops a body
    let dropped: Vec<_> = named(&all, "IdemBodiesDropped")
        .into_iter()
        .map(|a| a["labels"]["handler"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert!(
        !dropped.is_empty() && dropped.iter().all(|h| h == "award_points"),
        "IdemBodiesDropped for award_points alone: {dropped:?}"
    );

    // Every query of every panel, and every variable, has data.
    let queries = dashboard_queries();
    assert!(queries.len() >= 15, "{} queries", queries.len());
    let variables = dashboard_variables();
    wait_for(
        "every dashboard query returns data",
        Duration::from_secs(30),
        || {
            app.assert_running();
            let mut empty = Vec::new();
            for (title, expr) in &queries {
                let q = instantiate(expr);
                let result = query(prom_port, &q);
                if !result.iter().any(finite) {
                    empty.push(format!("{title}: {q} -> {result:?}"));
                }
            }
            for (name, label, series) in &variables {
                let values = api(
                    prom_port,
                    &format!("/api/v1/label/{label}/values?match[]={}", encode(series)),
                );
                if values.as_array().is_none_or(|v| v.is_empty()) {
                    empty.push(format!("variable {name}: no {label} of {series}"));
                }
            }
            if empty.is_empty() {
                Ok(())
            } else {
                Err(format!("no data:\n{}", empty.join("\n")))
            }
        },
    );
    eprintln!(
        "{} dashboard queries and {} variables answered, {:.1} s into the run",
        queries.len(),
        variables.len(),
        started.elapsed().as_secs_f64()
    );

    // SIGTERM: the consumers finish what is in flight, report, and the
    // example removes its queues.
    let status = app.terminate(Duration::from_secs(30));
    let log = app.log();
    assert!(
        status.is_some_and(|s| s.success()),
        "the example did not stop cleanly on SIGTERM ({status:?}):\n{log}"
    );
    for needed in [
        "the network blips",
        "the duplicate storm",
        "_orders: acked",
        "_points: acked",
    ] {
        assert!(
            log.contains(needed),
            "the example's output lacks {needed:?}:\n{log}"
        );
    }
    drop(prom);
}
