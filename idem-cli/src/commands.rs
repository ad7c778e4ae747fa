//! The commands, written once for every store: each asks the store through
//! [`Inspect`] and writes its answer as text or JSON.

use idem_runtime::clock::{Clock as _, SystemClock};
use idem_runtime::store::sql::SCHEMA_VERSION;
use idem_runtime::store::{Filter, Forgot, HandlerStats, Inspect, Order, Query, Schema, StoredKey};
use idem_runtime::{Key, KeyPart, StoreError};
use serde::Serialize;

use crate::open::Kind;
use crate::render::{
    RecordJson, cut, failures_cell, record_text, relative, shown_key, status_now, table, utc, when,
};
use crate::{Command, Failure, KeyArgs, ListArgs};

/// What the commands need to know besides the store.
#[derive(Debug)]
pub(crate) struct Context {
    /// `--json`.
    pub(crate) json: bool,
    /// Which store.
    pub(crate) store: Kind,
    /// The SQL table, or the Redis prefix.
    pub(crate) table: String,
}

/// The stored key `args` name: its parts encoded as the runtime derives a
/// key, or the `--raw` stored form, checked.
pub(crate) fn stored_key(args: &KeyArgs) -> Result<String, Failure> {
    if let Some(raw) = &args.raw {
        return StoredKey::parse(raw)
            .map(|key| key.as_str().to_owned())
            .map_err(|e| Failure::Usage(format!("malformed --raw key: {e}")));
    }
    if args.parts.is_empty() {
        return Err(Failure::Usage(format!(
            "no key given for handler `{}`: write its parts after the handler, in the order of its key expression (`idem show deduct_stock A-17 apple`), or its stored form with --raw",
            args.handler
        )));
    }
    let parts: Vec<&dyn KeyPart> = args.parts.iter().map(|p| p as &dyn KeyPart).collect();
    Key::from_parts(&parts)
        .map(|key| key.as_str().to_owned())
        .map_err(|e| Failure::Usage(format!("malformed key: {e}")))
}

/// Runs `command` on `store`; the text to print.
pub(crate) async fn run<S: Inspect>(
    store: &S,
    ctx: &Context,
    command: &Command,
    key: Option<&String>,
) -> Result<String, Failure> {
    let now = SystemClock.now_millis();
    let key = key.map(String::as_str).unwrap_or_default();
    match command {
        Command::Show(args) => show(store, ctx, &args.handler, key, now).await,
        Command::List(args) => list(store, ctx, args, now).await,
        Command::Stats => stats(store, ctx, now).await,
        Command::Forget(args) => forget(store, ctx, &args.key.handler, key, args.force, now).await,
        Command::Sweep => sweep(store, ctx).await,
        Command::Schema => schema(store, ctx).await,
    }
}

async fn show<S: Inspect>(
    store: &S,
    ctx: &Context,
    handler: &str,
    key: &str,
    now: i64,
) -> Result<String, Failure> {
    match store
        .lookup(handler, key)
        .await
        .map_err(|e| failed(ctx, e))?
    {
        Some(record) if ctx.json => json(&RecordJson::new(&record, now)),
        Some(record) => Ok(record_text(&record, now)),
        None => Err(absent(store, ctx, handler, key).await),
    }
}

async fn list<S: Inspect>(
    store: &S,
    ctx: &Context,
    args: &ListArgs,
    now: i64,
) -> Result<String, Failure> {
    let filter = match (args.status, args.stuck, args.failed) {
        (Some(filter), _, _) => filter,
        (None, true, _) => Filter::Stuck,
        (None, false, true) => Filter::Failed,
        (None, false, false) => Filter::Any,
    };
    let order = if args.newest_first {
        Order::NewestFirst
    } else {
        Order::OldestFirst
    };
    let query = Query::new().filter(filter).limit(args.limit).order(order);
    let records = store
        .list(&args.handler, query)
        .await
        .map_err(|e| failed(ctx, e))?;
    if records.is_empty() {
        known_handler(store, ctx, &args.handler).await?;
    }
    if ctx.json {
        #[derive(Serialize)]
        struct Listing<'r> {
            handler: &'r str,
            #[serde(flatten)]
            query: Query,
            records: Vec<RecordJson<'r>>,
        }
        return json(&Listing {
            handler: &args.handler,
            query,
            records: records.iter().map(|r| RecordJson::new(r, now)).collect(),
        });
    }
    let what = match filter {
        Filter::Status(status) => format!(" with status {status}"),
        Filter::Stuck => " stuck past their lease".to_owned(),
        Filter::Failed => " that saw a failure".to_owned(),
        Filter::Exhausted => " out of attempts".to_owned(),
        _ => String::new(),
    };
    if records.is_empty() {
        return Ok(format!("no records of `{}`{what}\n", args.handler));
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                cut(&shown_key(&r.key), 40),
                status_now(r, now),
                r.attempts.to_string(),
                failures_cell(r),
                relative(r.created_at_ms, now),
                relative(r.expires_at_ms, now),
                r.last_error
                    .as_deref()
                    .map_or("-".to_owned(), |e| cut(e, 60)),
            ]
        })
        .collect();
    let mut out = format!(
        "{} record{} of `{}`{what}, {}:\n",
        records.len(),
        if records.len() == 1 { "" } else { "s" },
        args.handler,
        match order {
            Order::OldestFirst => "oldest claim first",
            Order::NewestFirst => "newest claim first",
        }
    );
    out.push_str(&table(
        &[
            "KEY",
            "STATUS",
            "ATTEMPTS",
            "FAILURES",
            "CREATED",
            "EXPIRES",
            "LAST ERROR",
        ],
        &rows,
    ));
    if records.len() == usize::try_from(args.limit).unwrap_or(usize::MAX) {
        out.push_str(&format!("(the first {}; --limit N for more)\n", args.limit));
    }
    Ok(out)
}

async fn stats<S: Inspect>(store: &S, ctx: &Context, now: i64) -> Result<String, Failure> {
    let stats = store.stats().await.map_err(|e| failed(ctx, e))?;
    if ctx.json {
        #[derive(Serialize)]
        struct Counts<'s> {
            #[serde(flatten)]
            counts: &'s HandlerStats,
            oldest_in_progress_at: Option<String>,
        }
        #[derive(Serialize)]
        struct StatsJson<'s> {
            store: &'static str,
            at_ms: i64,
            at: String,
            handlers: Vec<Counts<'s>>,
        }
        return json(&StatsJson {
            store: ctx.store.name(),
            at_ms: stats.at_ms,
            at: utc(stats.at_ms),
            handlers: stats
                .handlers
                .iter()
                .map(|counts| Counts {
                    counts,
                    oldest_in_progress_at: counts.oldest_in_progress_at_ms.map(utc),
                })
                .collect(),
        });
    }
    if stats.handlers.is_empty() {
        return Ok(format!("no records in {}\n", place(ctx)));
    }
    let rows: Vec<Vec<String>> = stats
        .handlers
        .iter()
        .map(|h| {
            vec![
                h.handler.clone(),
                h.records.to_string(),
                h.in_progress.to_string(),
                h.completed.to_string(),
                h.failed.to_string(),
                h.retry.to_string(),
                h.expired.to_string(),
                h.oldest_in_progress_at_ms
                    .map_or("-".to_owned(), |at| when(at, now)),
            ]
        })
        .collect();
    Ok(table(
        &[
            "HANDLER",
            "RECORDS",
            "IN_PROGRESS",
            "COMPLETED",
            "FAILED",
            "RETRY",
            "EXPIRED",
            "OLDEST IN PROGRESS",
        ],
        &rows,
    ))
}

async fn forget<S: Inspect>(
    store: &S,
    ctx: &Context,
    handler: &str,
    key: &str,
    force: bool,
    now: i64,
) -> Result<String, Failure> {
    match store
        .forget(handler, key, force)
        .await
        .map_err(|e| failed(ctx, e))?
    {
        Forgot::Deleted(record) => {
            if ctx.json {
                #[derive(Serialize)]
                struct Deleted<'r> {
                    result: &'static str,
                    record: RecordJson<'r>,
                }
                return json(&Deleted {
                    result: "deleted",
                    record: RecordJson::new(&record, now),
                });
            }
            Ok(format!(
                "forgot key {} of `{handler}` (it was {}, {} attempt{}, {} failure{}); its next delivery runs the handler again\n",
                shown_key(key),
                status_now(&record, now),
                record.attempts,
                if record.attempts == 1 { "" } else { "s" },
                record.failures,
                if record.failures == 1 { "" } else { "s" },
            ))
        }
        Forgot::Refused(record) => Err(Failure::Refused(format!(
            "key {} of `{handler}` is held by a live claim (lease holder {}, its lease ends {}): its body may be running now; pass --force to forget it anyway",
            shown_key(key),
            record.token.as_deref().unwrap_or("unknown"),
            relative(record.expires_at_ms, now),
        ))),
        Forgot::Absent => Err(absent(store, ctx, handler, key).await),
        _ => Err(Failure::Store(
            "the store answered in a way this idem does not know".into(),
        )),
    }
}

async fn sweep<S: Inspect>(store: &S, ctx: &Context) -> Result<String, Failure> {
    let swept = store.sweep().await.map_err(|e| failed(ctx, e))?;
    if ctx.json {
        return json(&swept);
    }
    Ok(if swept.native_expiry {
        format!(
            "{} expires its records by itself (key TTLs): nothing to sweep\n",
            ctx.store.name()
        )
    } else {
        format!(
            "deleted {} expired record{} from {}\n",
            swept.deleted,
            if swept.deleted == 1 { "" } else { "s" },
            place(ctx)
        )
    })
}

async fn schema<S: Inspect>(store: &S, ctx: &Context) -> Result<String, Failure> {
    let schema = store.schema().await.map_err(|e| failed(ctx, e))?;
    if schema == Schema::NoTable {
        return Err(Failure::NotFound(format!(
            "no table `{}` in this database: the store was never migrated, or --table names another",
            ctx.table
        )));
    }
    let sql = ctx.store != Kind::Redis;
    if ctx.json {
        #[derive(Serialize)]
        struct SchemaJson<'c> {
            store: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            table: Option<&'c str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            prefix: Option<&'c str>,
            version: Option<u32>,
            current: Option<u32>,
        }
        return json(&SchemaJson {
            store: ctx.store.name(),
            table: sql.then_some(ctx.table.as_str()),
            prefix: (!sql).then_some(ctx.table.as_str()),
            version: schema.version(),
            current: sql.then_some(SCHEMA_VERSION),
        });
    }
    Ok(match schema.version() {
        Some(version) if version < SCHEMA_VERSION => format!(
            "table `{}`: schema version {version}, older than this release's {SCHEMA_VERSION}; the store's migrate() upgrades it in place\n",
            ctx.table
        ),
        Some(version) => format!(
            "table `{}`: schema version {version} (this release's is {SCHEMA_VERSION})\n",
            ctx.table
        ),
        None => format!(
            "{} keeps no schema: each record is a hash under `{}:`\n",
            ctx.store.name(),
            ctx.table
        ),
    })
}

/// Why `key` of `handler` has no record: the handler has none at all (say
/// which handlers do), the key has another number of parts than the
/// handler's records (a usage error), or the handler has no such key.
async fn absent<S: Inspect>(store: &S, ctx: &Context, handler: &str, key: &str) -> Failure {
    if let Err(unknown) = known_handler(store, ctx, handler).await {
        return unknown;
    }
    let given = StoredKey::parse(key)
        .ok()
        .and_then(|k| k.parts().map(<[_]>::len));
    let hint = match (given, key_size(store, handler).await) {
        (Some(given), Some((parts, example))) if given != parts => {
            return Failure::Usage(format!(
                "handler `{handler}` has keys of {parts} part{} (as its record of key {example}), \
                 not {given}: give its parts after the handler, in the order of its key expression",
                if parts == 1 { "" } else { "s" },
            ));
        }
        (_, Some(_)) => String::new(),
        // No record tells the handler's parts (keys stored as digests).
        (_, None) => "; a key is its parts in the order of the handler's key expression, \
             each as its text (`key = \"order_id + sku\"`: `idem show deduct_stock A-17 apple`)"
            .to_owned(),
    };
    Failure::NotFound(format!(
        "no record of key {} (stored {key}) for handler `{handler}`: never seen, forgotten, or expired and swept{hint}",
        shown_key(key)
    ))
}

/// How many parts `handler`'s keys have, and one key as an example, as its
/// first records in the store tell (none if they are digests, or disagree).
async fn key_size<S: Inspect>(store: &S, handler: &str) -> Option<(usize, String)> {
    let records = store.list(handler, Query::new().limit(20)).await.ok()?;
    let mut keys = records.iter().filter_map(|r| StoredKey::parse(&r.key).ok());
    let first = keys.find(|k| k.parts().is_some())?;
    let parts = first.parts()?.len();
    keys.all(|k| k.parts().is_none_or(|p| p.len() == parts))
        .then(|| (parts, first.shown()))
}

/// Fails unless `handler` has records in the store, saying which handlers
/// have.
async fn known_handler<S: Inspect>(store: &S, ctx: &Context, handler: &str) -> Result<(), Failure> {
    let handlers = store.handlers().await.map_err(|e| failed(ctx, e))?;
    if handlers.iter().any(|h| h == handler) {
        return Ok(());
    }
    const SHOWN: usize = 20;
    let which = if handlers.is_empty() {
        format!("{} holds no records at all", place(ctx))
    } else {
        let mut names: Vec<String> = handlers
            .iter()
            .take(SHOWN)
            .map(|h| format!("`{h}`"))
            .collect();
        if handlers.len() > SHOWN {
            names.push(format!("and {} more", handlers.len() - SHOWN));
        }
        format!("handlers with records: {}", names.join(", "))
    };
    Err(Failure::NotFound(format!(
        "unknown handler `{handler}`: it has no records in {}; {which}",
        place(ctx)
    )))
}

/// Where the records are, for messages: `table `idem_keys``.
fn place(ctx: &Context) -> String {
    match ctx.store {
        Kind::Redis => format!("prefix `{}`", ctx.table),
        _ => format!("table `{}`", ctx.table),
    }
}

/// A store's error as the command's failure.
fn failed(ctx: &Context, e: StoreError) -> Failure {
    match e {
        StoreError::MissingTable { table } => Failure::Store(format!(
            "no table `{table}` in this database: the store was never migrated, or --table names another"
        )),
        e @ (StoreError::InvalidTableName { .. } | StoreError::InvalidPrefix { .. }) => {
            Failure::Usage(e.to_string())
        }
        e => Failure::Store(format!("the {} store failed: {e}", ctx.store.name())),
    }
}

/// `value` as pretty JSON and a newline.
fn json<T: Serialize>(value: &T) -> Result<String, Failure> {
    serde_json::to_string_pretty(value)
        .map(|text| text + "\n")
        .map_err(|e| Failure::Store(format!("cannot write JSON: {e}")))
}
