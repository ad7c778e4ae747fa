//! The files of `observability/` against promtool and the runtime's metric
//! names: the alerting rules are valid and pass their unit tests, each rule
//! has a test where it fires and one where it does not, the Grafana
//! dashboard imports anywhere (its datasource is a variable) and reads only
//! series the runtime records, and the operations chapter's metrics table
//! lists them all.
//! The live check (a real Prometheus scraping the example) is
//! `observability_prometheus`, among the slow tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use idem_tests::unavailable;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn observability(file: &str) -> PathBuf {
    root().join("observability").join(file)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `promtool`, or `None` (after [`unavailable`]) when it is not installed.
fn promtool() -> Option<PathBuf> {
    let program = PathBuf::from(std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into()));
    match Command::new(&program).arg("--version").output() {
        Ok(out) if out.status.success() => Some(program),
        Ok(out) => unavailable(
            "promtool",
            &program.display().to_string(),
            format!("--version exited with {}", out.status),
        ),
        Err(e) => unavailable(
            "promtool",
            &program.display().to_string(),
            format!("{e}; Debian: apt-get install --no-install-recommends prometheus"),
        ),
    }
}

/// Runs promtool with `args` in `observability/` and returns its output,
/// failing the test when it fails.
fn promtool_passes(promtool: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(root().join("observability"))
        .output()
        .expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_rules_are_valid_and_pass_their_unit_tests() {
    let promtool = idem_tests::or_skip!(promtool());
    let checked = promtool_passes(&promtool, &["check", "rules", "alerts.yml"]);
    let rules = alert_names().len();
    assert!(
        checked.contains(&format!("SUCCESS: {rules} rules found")),
        "promtool found another number of rules than the {rules} alerts in alerts.yml:\n{checked}"
    );
    let tested = promtool_passes(&promtool, &["test", "rules", "alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    promtool_passes(&promtool, &["check", "config", "prometheus.yml"]);
}

/// The alerts of alerts.yml, in order.
fn alert_names() -> Vec<String> {
    read(&observability("alerts.yml"))
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|n| n.trim().to_owned())
        .collect()
}

#[test]
fn every_rule_is_tested_firing_and_not_firing() {
    let tests = read(&observability("alerts.test.yml"));
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    // (alert, whether that evaluation expects it to fire)
    let mut cases = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = line.strip_prefix("alertname: ") {
            let expected = lines[i + 1..]
                .iter()
                .find(|l| l.starts_with("exp_alerts:"))
                .unwrap_or_else(|| panic!("alertname {name} without exp_alerts"));
            cases.push((name.trim().to_owned(), *expected != "exp_alerts: []"));
        }
    }
    let names = alert_names();
    assert!(names.len() >= 5, "alerts.yml has {names:?}");
    for name in &names {
        for fires in [true, false] {
            assert!(
                cases.contains(&(name.clone(), fires)),
                "alerts.test.yml has no evaluation where {name} {}",
                if fires { "fires" } else { "does not fire" }
            );
        }
    }
    for (name, _) in &cases {
        assert!(
            names.contains(name),
            "alerts.test.yml tests {name}, which alerts.yml does not have"
        );
    }
}

/// The metric names the runtime records, read from `pub mod metric` in
/// telemetry.rs (so a series added there shows up here).
fn metric_names() -> BTreeSet<String> {
    let source = read(&root().join("idem-runtime/src/telemetry.rs"));
    let names: BTreeSet<String> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        .filter_map(|l| l.split_once(": &str = \""))
        .filter_map(|(_, rest)| rest.split_once('"'))
        .map(|(name, _)| name.to_owned())
        .collect();
    assert!(names.contains(idem_runtime::metric::CALLS));
    assert!(names.contains(idem_runtime::metric::CONSUMER_LAG));
    names
}

/// The `idem_*` series a PromQL expression reads (a histogram's `_bucket`
/// counts as its name).
fn series_in(expr: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("idem_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let name = name.strip_suffix("_bucket").unwrap_or(name);
        found.insert(name.to_owned());
        rest = &tail[end..];
    }
    found
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read(&observability("grafana-dashboard.json")))
        .expect("the dashboard is JSON")
}

/// Every panel, those inside rows included.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut all = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        all.push(p);
        if let Some(inner) = p["panels"].as_array() {
            all.extend(inner);
        }
    }
    all
}

#[test]
fn the_dashboard_imports_anywhere_and_reads_only_idem_series() {
    let d = dashboard();
    let known = metric_names();
    let variables = d["templating"]["list"].as_array().expect("templating");
    let ds = variables
        .iter()
        .find(|v| v["name"] == "DS_PROMETHEUS")
        .expect("a datasource variable DS_PROMETHEUS");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()));

    let mut ids = BTreeSet::new();
    let mut read_series = BTreeSet::new();
    let mut graphs = 0;
    for p in panels(&d) {
        let title = p["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(p["id"].as_u64().expect("an id")),
            "{title}: id taken"
        );
        if p["type"] == "row" {
            continue;
        }
        graphs += 1;
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
            let expr = t["expr"].as_str().expect("a PromQL expression");
            let series = series_in(expr);
            assert!(!series.is_empty(), "{title}: {expr} reads no idem series");
            for s in &series {
                assert!(known.contains(s), "{title}: {s} is not a runtime metric");
            }
            read_series.extend(series);
        }
    }
    assert!(graphs >= 10, "{graphs} panels");
    for v in variables.iter().filter(|v| v["type"] == "query") {
        assert_eq!(v["datasource"]["uid"], "${DS_PROMETHEUS}");
        let q = v["query"]["query"].as_str().expect("a variable query");
        for s in series_in(q) {
            assert!(known.contains(&s), "variable {}: {s}", v["name"]);
        }
    }
    // what the dashboard is for
    for needed in [
        "idem_calls_total",
        "idem_claim_seconds",
        "idem_consumer_retries_total",
        "idem_consumer_dead_letters_total",
        "idem_consumer_in_flight",
        "idem_consumer_lag",
        "idem_consumer_end_to_end_seconds",
    ] {
        assert!(read_series.contains(needed), "no panel reads {needed}");
    }
}

#[test]
fn the_alerts_read_only_idem_series() {
    let known = metric_names();
    let rules: String = read(&observability("alerts.yml"))
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let series = series_in(&rules);
    assert!(series.len() >= 5, "{series:?}");
    for s in series {
        assert!(
            known.contains(&s),
            "alerts.yml reads {s}, which the runtime does not record"
        );
    }
}

#[test]
fn the_operations_chapter_lists_every_metric() {
    let guide = read(&root().join("idem-runtime/src/guide/operations.md"));
    for name in metric_names() {
        let row = format!("| `{name}");
        assert!(
            guide.contains(&row),
            "operations.md's metrics table has no row for {name}"
        );
    }
    for alert in alert_names() {
        assert!(
            guide.contains(&alert),
            "operations.md does not explain the alert {alert}"
        );
    }
}
