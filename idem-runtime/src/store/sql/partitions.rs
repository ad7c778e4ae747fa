//! A PostgreSQL dedup table partitioned by time ([`Partitions`]): expiry
//! by dropping a partition whose records have all expired, at a constant
//! cost, instead of deleting rows one by one.
//!
//! # The layout
//!
//! The table has one column more than a plain one, `part`: the number of
//! the period of width [`Partitions::width`] its row was written in (the
//! database's milliseconds since the epoch divided by the width; the
//! column's default, so that no statement of the store names it). The
//! table is partitioned by range of `part`, one partition a period, named
//! `<table>_p<part>`, plus a default partition `<table>_pdefault` that takes
//! a row whose period has no partition (the sweeper did not run for a
//! while), so that a claim never fails for want of one.
//!
//! # One record a key, across partitions
//!
//! PostgreSQL keeps a unique index per partition only, so the primary key is
//! `(handler, key, part)`. What makes `(handler, key)` unique across the
//! table is a trigger that runs before every insert: it takes a transaction
//! lock on the key (`pg_advisory_xact_lock` of a hash of handler and key,
//! so that two inserts of one key run one after the other even when a
//! period ends between them) and moves a row of the key that stands in
//! another partition into the insert's own (an `UPDATE` of `part`). The
//! insert then meets that row in its partition's unique index, as it would
//! in a plain table: an `ON CONFLICT DO NOTHING` inserts nothing, a plain
//! `INSERT` fails with a unique violation. Every read by key reads every
//! partition (one index lookup each); there are as many as periods in the
//! longest a record lives, and never more than one row of a key.
//!
//! A writer that waited on a row the trigger moved (a lease completed while
//! a duplicate claims its key) gets PostgreSQL's serialization failure
//! (`40001`, "tuple to be locked was already moved to another partition")
//! and the store runs its statement again, which finds the row where it
//! went. Claims on a partitioned table insert and then take over a
//! claimable row with an `UPDATE` (the shape of the MySQL store's claims):
//! PostgreSQL refuses an `ON CONFLICT DO UPDATE` of a row that a trigger
//! moved in the same statement.
//!
//! # The sweep
//!
//! [`sweep_expired`](super::SqlStore::sweep_expired) calls a function the
//! migration created, `<table>_idem_maintain(now, batch)`, which does one
//! thing a call, each in a transaction of its own, until one removes rows
//! or there is nothing left to do, in this order (and nothing while another sweep of the
//! table runs it, so that consumers that each run a sweeper do not
//! deadlock on the table's locks):
//!
//! 1. creates the partitions of the current period and the
//!    [`ahead`](Partitions::ahead) next ones that are missing (skipping a
//!    period that rows in the default partition already hold: those stay
//!    there and are deleted as they expire);
//! 2. else drops the oldest partition whose period has ended and whose rows
//!    have all expired, and returns how many rows it held (counted before
//!    the drop; the drop takes the table's `ACCESS EXCLUSIVE` lock for the
//!    check and the drop alone, waiting at most 100 ms for it and trying
//!    again at the next sweep if it could not have it);
//! 3. else deletes at most `batch` expired rows of the default partition.
//!
//! A partition that still holds a live record (a failing key whose retries
//! keep it alive, a lease in progress) is kept until its last record
//! expires; a key claimed again moves its row into the current partition.

use std::time::Duration;

use crate::error::StoreError;

/// How a PostgreSQL dedup table is partitioned: by the period a row was
/// written in, one partition a period of [`width`](Self::width), with
/// [`ahead`](Self::ahead) partitions created ahead of time by the sweeper.
///
/// Choose a width that divides the longest ttl into a handful of periods:
/// the table then holds the rows of the ttl plus one period, and each claim
/// reads one index per period (a day for ttls of days; an hour for ttls of
/// hours).
///
/// # Examples
///
/// ```
/// use idem_runtime::store::sql::Partitions;
/// use std::time::Duration;
///
/// let daily = Partitions::daily();
/// assert_eq!(daily.width(), Duration::from_secs(86_400));
/// assert_eq!(daily.ahead(), 3);
///
/// let hourly = Partitions::every(Duration::from_secs(3_600))?.with_ahead(6);
/// assert_eq!(hourly.ahead(), 6);
/// assert!(Partitions::every(Duration::from_millis(1)).is_err());
/// # Ok::<(), idem_runtime::StoreError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partitions {
    width_ms: i64,
    ahead: u32,
}

impl Partitions {
    /// The shortest period a partition may cover.
    pub const MIN_WIDTH: Duration = Duration::from_secs(1);

    /// One partition a day, three created ahead.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::sql::Partitions;
    /// assert_eq!(Partitions::daily().width().as_secs(), 86_400);
    /// ```
    pub fn daily() -> Partitions {
        Partitions {
            width_ms: 86_400_000,
            ahead: 3,
        }
    }

    /// One partition every `width` (whole milliseconds, at least
    /// [`MIN_WIDTH`](Self::MIN_WIDTH)), three created ahead.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::sql::Partitions;
    /// use std::time::Duration;
    ///
    /// let p = Partitions::every(Duration::from_secs(6 * 3_600))?;
    /// assert_eq!(p.width(), Duration::from_secs(21_600));
    /// # Ok::<(), idem_runtime::StoreError>(())
    /// ```
    pub fn every(width: Duration) -> Result<Partitions, StoreError> {
        let width_ms = i64::try_from(width.as_millis()).unwrap_or(i64::MAX);
        if width < Self::MIN_WIDTH || !width.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(StoreError::Schema(format!(
                "a partition's period must be whole milliseconds and at least {:?}, not {width:?}",
                Self::MIN_WIDTH
            )));
        }
        Ok(Partitions { width_ms, ahead: 3 })
    }

    /// Creates `ahead` partitions beyond the current period's at each
    /// sweep, so that a sweeper that misses a few runs leaves no period
    /// without its partition.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::sql::Partitions;
    /// assert_eq!(Partitions::daily().with_ahead(7).ahead(), 7);
    /// ```
    #[must_use]
    pub fn with_ahead(self, ahead: u32) -> Partitions {
        Partitions { ahead, ..self }
    }

    /// The period one partition covers.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::sql::Partitions;
    /// assert_eq!(Partitions::daily().width().as_secs(), 86_400);
    /// ```
    pub fn width(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.width_ms).unwrap_or(0))
    }

    /// How many partitions beyond the current period's the sweeper keeps.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::sql::Partitions;
    /// assert_eq!(Partitions::daily().ahead(), 3);
    /// ```
    pub fn ahead(&self) -> u32 {
        self.ahead
    }

    /// The width in milliseconds.
    #[cfg(feature = "postgres")]
    pub(crate) fn width_ms(&self) -> i64 {
        self.width_ms
    }
}

/// The SQL of a partitioned table that differs from a plain one's.
#[derive(Debug, Clone)]
pub struct PartitionedSql {
    /// Creates the table, its partitions of now, its trigger and its
    /// maintenance function, if they do not exist (no parameters).
    pub create: String,
    /// One step of a sweep: a statement template returning the rows it
    /// removed, or -1 after a step that removed none (partitions made, an
    /// empty one dropped) when another step may follow (`{now}`,
    /// `:batch`).
    pub sweep: String,
    /// Turns a plain table of the name into a partition of the
    /// partitioned one (see [`PgStore::partition_existing`](crate::PgStore::partition_existing)):
    /// the statements that run on their own, without blocking the
    /// table's writers (a column, an index built concurrently, a check),
    /// each safe to run again.
    pub convert_online: Vec<String>,
    /// Then, in one transaction: the swap of the plain table for the
    /// partitioned one, with the plain one as its first partition.
    pub convert_swap: String,
}

/// What a store opened without partitions needs to sweep a table that was
/// partitioned since (by [`PgStore::partition_existing`](crate::PgStore::partition_existing)
/// elsewhere, or by a store opened with them): the table may be of either
/// layout, and a partitioned one is kept by its own function.
#[derive(Debug, Clone)]
pub struct Upkeep {
    /// Answers 1 when the table is partitioned and has its maintenance
    /// function, 0 otherwise (no parameters).
    pub partitioned: String,
    /// One step of a partitioned table's sweep, as [`PartitionedSql::sweep`]:
    /// the function holds the periods' width, so the call does not.
    pub sweep: String,
}

/// [`Upkeep`] on PostgreSQL, for `table` (validated, as for [`postgres`]).
#[cfg(feature = "postgres")]
pub(super) fn postgres_upkeep(table: &str) -> Upkeep {
    let maintain = postgres_maintain(table);
    Upkeep {
        // Both names are validated identifiers: safe in a literal.
        partitioned: format!(
            "SELECT count(*) FROM pg_class
             WHERE oid = to_regclass('{table}') AND relkind = 'p'
               AND to_regprocedure('{maintain}(bigint, bigint)') IS NOT NULL"
        ),
        sweep: postgres_sweep(&maintain),
    }
}

/// The maintenance function of `table`, qualified as the table is.
#[cfg(feature = "postgres")]
fn postgres_maintain(table: &str) -> String {
    use super::table::{bare, derived_name};

    qualify_as(table, &derived_name(bare(table), "_idem_maintain"))
}

/// `name` in `table`'s schema, qualified as the table is: the objects that
/// go with a table (its partitions, functions) live in its schema.
#[cfg(feature = "postgres")]
fn qualify_as(table: &str, name: &str) -> String {
    match table.split_once('.') {
        Some((schema, _)) => format!("{schema}.{name}"),
        None => name.to_owned(),
    }
}

/// One step of a sweep by the maintenance function `maintain`.
#[cfg(feature = "postgres")]
fn postgres_sweep(maintain: &str) -> String {
    format!("SELECT {maintain}({{now}}, :batch)")
}

/// The partitioned table's SQL on PostgreSQL, for `table` (validated:
/// letters, digits, `_`, at most one `.`) and `partitions`, where `now` is
/// the database's clock in ms (the dialect's `NOW`) and `columns` the
/// table's columns with their types, as a plain table has them.
#[cfg(feature = "postgres")]
pub(super) fn postgres(
    table: &str,
    partitions: Partitions,
    now: &str,
    columns: &str,
) -> PartitionedSql {
    use super::table::{bare, derived_name};

    let width = partitions.width_ms();
    let ahead = partitions.ahead();
    let qualify = |name: &str| qualify_as(table, name);
    let bare = bare(table);
    // An index is named without its schema: it goes to its table's.
    let index = derived_name(bare, "_expires_at");
    // Room for the period's number (at most 19 digits) after the prefix.
    let prefix = derived_name(bare, &format!("_p{}", "0".repeat(19)));
    let prefix = prefix[..prefix.len() - 19].to_owned();
    let default = qualify(&format!("{prefix}default"));
    let bring = qualify(&derived_name(bare, "_idem_bring"));
    let maintain = postgres_maintain(table);
    let schema_of_table = match table.split_once('.') {
        Some((schema, _)) => format!("'{schema}'"),
        None => "current_schema()".to_owned(),
    };
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {table} (
            {columns},
            part BIGINT NOT NULL DEFAULT ({now} / {width}),
            PRIMARY KEY (handler, key, part)
        ) PARTITION BY RANGE (part);
        CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);
        CREATE TABLE IF NOT EXISTS {default} PARTITION OF {table} DEFAULT;
        CREATE OR REPLACE FUNCTION {bring}() RETURNS trigger LANGUAGE plpgsql AS $idem$
        BEGIN
            -- the row this function moves comes back through it: let it pass
            IF pg_trigger_depth() > 1 THEN
                RETURN NEW;
            END IF;
            PERFORM pg_advisory_xact_lock(
                hashtextextended(NEW.handler || '/' || NEW.key, hashtext('{table}')));
            -- a read first: an UPDATE of a partitioned table costs more
            -- to start than a read, and a fresh key has no row to move
            IF EXISTS (SELECT 1 FROM {table}
                        WHERE handler = NEW.handler AND key = NEW.key AND part <> NEW.part) THEN
                UPDATE {table} SET part = NEW.part
                 WHERE handler = NEW.handler AND key = NEW.key AND part <> NEW.part;
            END IF;
            RETURN NEW;
        END
        $idem$;
        DO $idem$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_trigger
                           WHERE tgrelid = '{table}'::regclass AND tgname = 'idem_bring') THEN
                CREATE TRIGGER idem_bring BEFORE INSERT ON {table}
                    FOR EACH ROW EXECUTE FUNCTION {bring}();
            END IF;
        END
        $idem$;
        CREATE OR REPLACE FUNCTION {maintain}(now_ms BIGINT, batch BIGINT)
        RETURNS BIGINT LANGUAGE plpgsql AS $idem$
        DECLARE
            this_period BIGINT := now_ms / {width};
            period BIGINT;
            held BIGINT;
            live BOOLEAN;
            created BOOLEAN := false;
            old RECORD;
        BEGIN
            -- one sweeper at a time: two creating or dropping partitions
            -- of one table would deadlock on its locks
            IF NOT pg_try_advisory_xact_lock(hashtext('idem_maintain_{table}')) THEN
                RETURN 0;
            END IF;
            -- 1. the partitions of this period and the next ones
            period := this_period;
            WHILE period <= this_period + {ahead} LOOP
                IF to_regclass(format('%I.%I', {schema_of_table}, '{prefix}' || period)) IS NULL
                   AND NOT EXISTS (SELECT 1 FROM {default} WHERE part = period) THEN
                    EXECUTE format('CREATE TABLE %I.%I PARTITION OF {table} FOR VALUES FROM (%s) TO (%s)',
                                   {schema_of_table}, '{prefix}' || period, period, period + 1);
                    created := true;
                END IF;
                period := period + 1;
            END LOOP;
            -- -1: a step that removed nothing and is worth another call
            -- (in a transaction of its own, so that this one's locks go)
            IF created THEN
                RETURN -1;
            END IF;
            -- 2. the oldest partition whose period has ended and whose rows all expired
            FOR old IN
                SELECT format('%I.%I', ns.nspname, c.relname) AS name,
                       substring(c.relname FROM length('{prefix}') + 1)::BIGINT AS period
                  FROM pg_inherits i
                  JOIN pg_class c ON c.oid = i.inhrelid
                  JOIN pg_namespace ns ON ns.oid = c.relnamespace
                 WHERE i.inhparent = '{table}'::regclass
                   AND c.relname ~ ('^{prefix}[0-9]+$')
                 ORDER BY 2
            LOOP
                EXIT WHEN old.period >= this_period;
                EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE expires_at > $1)', old.name)
                    INTO live USING now_ms;
                CONTINUE WHEN live;
                EXECUTE format('SELECT count(*) FROM %s', old.name) INTO held;
                BEGIN
                    SET LOCAL lock_timeout = '100ms';
                    LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE;
                    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE expires_at > $1)', old.name)
                        INTO live USING now_ms;
                    IF NOT live THEN
                        EXECUTE format('DROP TABLE %s', old.name);
                        RETURN CASE WHEN held = 0 THEN -1 ELSE held END;
                    END IF;
                EXCEPTION WHEN lock_not_available THEN
                    RETURN 0;
                END;
            END LOOP;
            -- 3. the expired rows of the default partition
            WITH gone AS (
                DELETE FROM {default} WHERE ctid = ANY (ARRAY(
                    SELECT ctid FROM {default} WHERE expires_at <= now_ms
                    ORDER BY expires_at LIMIT batch FOR UPDATE SKIP LOCKED))
                RETURNING 1)
            SELECT count(*) INTO held FROM gone;
            RETURN held;
        END
        $idem$;"
    );
    // The plain table becomes the partition of period 0, long past: the
    // sweep drops it once its last record expired.
    let legacy = format!("{prefix}0");
    let part_key = derived_name(bare, "_part_key");
    let convert_online = vec![
        format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS part BIGINT NOT NULL DEFAULT 0"),
        format!(
            "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {part_key} ON {table} (handler, key, part)"
        ),
        format!(
            "DO $idem$
            BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '{table}'::regclass
                               AND conname = 'idem_legacy_part') THEN
                    ALTER TABLE {table} ADD CONSTRAINT idem_legacy_part CHECK (part = 0) NOT VALID;
                END IF;
            END
            $idem$"
        ),
        format!("ALTER TABLE {table} VALIDATE CONSTRAINT idem_legacy_part"),
    ];
    let convert_swap = format!(
        "LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE;
        DO $idem$
        BEGIN
            EXECUTE format('ALTER TABLE {table} DROP CONSTRAINT %I',
                (SELECT conname FROM pg_constraint
                  WHERE conrelid = '{table}'::regclass AND contype = 'p'));
        END
        $idem$;
        ALTER TABLE {table} ADD CONSTRAINT {legacy_pkey} PRIMARY KEY USING INDEX {part_key};
        ALTER INDEX {old_index} RENAME TO {legacy_index};
        ALTER TABLE {table} RENAME TO {legacy};
        {create}
        ALTER TABLE {table} ATTACH PARTITION {qualified_legacy} FOR VALUES FROM (0) TO (1);",
        legacy_pkey = derived_name(&legacy, "_pkey"),
        old_index = qualify(&index),
        legacy_index = derived_name(&legacy, "_expires_at"),
        qualified_legacy = qualify(&legacy),
    );
    PartitionedSql {
        create,
        sweep: postgres_sweep(&maintain),
        convert_online,
        convert_swap,
    }
}
