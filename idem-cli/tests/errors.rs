//! What the binary says before it reaches a store: bad arguments and URLs,
//! and servers that do not answer. One line on stderr each, and the exit
//! code the crate docs give (1 store, 2 usage). No server is needed: the
//! unreachable ones are loopback ports nothing listens on.

mod common;

use common::idem;

#[test]
fn no_store_is_a_usage_error() {
    let line = idem(&["stats"]).fails(2);
    assert!(
        line.starts_with("idem: no store: pass --store URL or set IDEM_STORE_URL"),
        "{line}"
    );
    let line = idem(&["--store", "  ", "stats"]).fails(2);
    assert!(line.starts_with("idem: no store"), "{line}");
}

#[test]
fn bad_urls_are_usage_errors() {
    for (url, says) in [
        (
            "http://db.internal/shop",
            "unsupported store URL `http://db.internal/shop`",
        ),
        ("shop.db", "unsupported store URL `shop.db`"),
        ("postgres://db.internal:99999/shop", "bad PostgreSQL URL"),
        ("mysql://root@db.internal:port/test", "bad MySQL URL"),
        ("redis://[::1", "bad Redis URL"),
        ("sqlite::memory:", "in-memory SQLite database"),
    ] {
        let line = idem(&["--store", url, "stats"]).fails(2);
        assert!(line.contains(says), "{url}: {line}");
    }
}

#[test]
fn options_of_another_store_are_usage_errors() {
    let line = idem(&["--store", "redis://127.0.0.1:1", "--table", "t", "stats"]).fails(2);
    assert_eq!(
        line,
        "idem: --table is for SQL stores; a Redis store takes --prefix"
    );
    let line = idem(&["--store", "sqlite:x.db", "--prefix", "p", "stats"]).fails(2);
    assert_eq!(
        line,
        "idem: --prefix is for Redis stores; a SQL store takes --table"
    );
    let line = idem(&["--store", "sqlite:x.db", "--cluster", "stats"]).fails(2);
    assert!(
        line.starts_with("idem: --cluster is for Redis URLs"),
        "{line}"
    );
    let line = idem(&["--store", "sqlite:x.db", "--table", "keys; drop", "stats"]).fails(2);
    assert!(
        line.starts_with("idem: invalid table name \"keys; drop\""),
        "{line}"
    );
    let line = idem(&["--store", "redis://127.0.0.1:1", "--prefix", "{a}", "stats"]).fails(2);
    assert!(line.starts_with("idem: invalid Redis key prefix"), "{line}");
}

#[test]
fn malformed_keys_are_usage_errors_before_any_connection() {
    // The store is unreachable: the key is refused first.
    let store = ["--store", "postgres://postgres@127.0.0.1:1/test"];
    for (args, says) in [
        (&["show", "h"][..], "no key given for handler `h`"),
        (&["forget", "h"], "no key given for handler `h`"),
        (
            &["show", "h", "--raw", ""],
            "is not a stored key: it is empty",
        ),
        (&["show", "h", "--raw", "A-17"], "is not a stored key"),
        (&["show", "h", "--raw", "#sha256:zz"], "a digest is"),
    ] {
        let mut all = store.to_vec();
        all.extend(args);
        let line = idem(&all).fails(2);
        assert!(line.contains(says), "{args:?}: {line}");
    }
}

#[test]
fn unreachable_servers_are_store_errors() {
    for url in [
        "postgres://postgres@127.0.0.1:1/test",
        "mysql://root@127.0.0.1:1/test",
        "redis://127.0.0.1:1",
    ] {
        let line = idem(&["--store", url, "--timeout", "5", "stats"]).fails(1);
        assert!(
            line.starts_with(&format!("idem: cannot reach the store at `{url}`: ")),
            "{line}"
        );
    }
    let line = idem(&["--store", "sqlite:/nonexistent/idem.db", "stats"]).fails(1);
    assert_eq!(line, "idem: no SQLite database at `/nonexistent/idem.db`");
}

#[test]
fn passwords_are_never_printed() {
    let line = idem(&["--store", "postgres://app:s3cr3t@127.0.0.1:1/shop", "stats"]).fails(1);
    assert!(!line.contains("s3cr3t"), "{line}");
    assert!(
        line.contains("postgres://app:***@127.0.0.1:1/shop"),
        "{line}"
    );
    let run = idem(&["--help"]);
    assert_eq!(run.code, 0);
    let run = common::idem_env(&["--help"], &[("IDEM_STORE_URL", "redis://:s3cr3t@h")]);
    assert!(!run.stdout.contains("s3cr3t"), "{}", run.stdout);
}

#[test]
fn argument_errors_are_clap_s_with_exit_2() {
    let run = idem(&["--store", "sqlite:x.db", "list"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("<HANDLER>"), "{}", run.stderr);
    let run = idem(&["--store", "sqlite:x.db", "list", "h", "--status", "done"]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr
            .contains("expected one of in_progress, completed, failed, retry"),
        "{}",
        run.stderr
    );
    let run = idem(&["--store", "sqlite:x.db", "list", "h", "--stuck", "--failed"]);
    assert_eq!(run.code, 2);
    let run = idem(&["frobnicate"]);
    assert_eq!(run.code, 2);
    let run = idem(&["--version"]);
    assert_eq!(run.code, 0);
    assert!(run.stdout.starts_with("idem "), "{}", run.stdout);
}
