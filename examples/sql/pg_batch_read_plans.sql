-- How a PostgreSQL batch's read of its records is planned when the
-- table's statistics do not know the handler (new since the last ANALYZE,
-- or a table that grew fast since): the form `handler = $1 AND key =
-- ANY($2)` against the key-by-key lookup the store runs (a lateral search
-- of the primary key a key; see the guide's postgres chapter, "Batches and
-- the planner"). A handler of 1,000,000 rows the statistics do not know
-- of, a batch of 1,000 fresh keys, each form three times, their plans,
-- then both again after an ANALYZE.
--
--   psql -h 127.0.0.1 -U postgres test -f examples/sql/pg_batch_read_plans.sql
--
-- It makes and drops the table `bench_batch_read_plans`.

DROP TABLE IF EXISTS bench_batch_read_plans;
CREATE TABLE bench_batch_read_plans (
    handler TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL, outcome TEXT,
    expires_at BIGINT NOT NULL, PRIMARY KEY (handler, key)
) WITH (autovacuum_enabled = false);
-- What the statistics know: another handler's rows.
INSERT INTO bench_batch_read_plans
    SELECT 'other', 'k' || g, 'completed', '1', 0 FROM generate_series(1, 2000) g;
ANALYZE bench_batch_read_plans;
-- What they do not.
INSERT INTO bench_batch_read_plans
    SELECT 'h', 'k' || g, 'completed', '1', 0 FROM generate_series(1, 1000000) g;

PREPARE any_form(text, text[]) AS
    SELECT cur.key, cur.status, cur.outcome FROM bench_batch_read_plans AS cur
    WHERE cur.handler = $1 AND cur.key = ANY ($2::text[]);
PREPARE lateral_form(text, text[]) AS
    SELECT cur.key, cur.status, cur.outcome FROM unnest($2::text[]) AS r(k)
    CROSS JOIN LATERAL (SELECT * FROM bench_batch_read_plans
                        WHERE handler = $1 AND key = r.k LIMIT 1) AS cur;
SELECT array_agg('n' || g)::text AS keys FROM generate_series(1, 1000) g \gset

\echo 'statistics without the handler: any, lateral (x3)'
\timing on
EXECUTE any_form('h', :'keys');
EXECUTE lateral_form('h', :'keys');
EXECUTE any_form('h', :'keys');
EXECUTE lateral_form('h', :'keys');
EXECUTE any_form('h', :'keys');
EXECUTE lateral_form('h', :'keys');
\timing off
EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, COSTS OFF) EXECUTE any_form('h', :'keys');
EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, COSTS OFF) EXECUTE lateral_form('h', :'keys');

ANALYZE bench_batch_read_plans;
\echo 'after ANALYZE: any, lateral (x3)'
\timing on
EXECUTE any_form('h', :'keys');
EXECUTE lateral_form('h', :'keys');
EXECUTE any_form('h', :'keys');
EXECUTE lateral_form('h', :'keys');
EXECUTE any_form('h', :'keys');
EXECUTE lateral_form('h', :'keys');
\timing off

DEALLOCATE any_form;
DEALLOCATE lateral_form;
DROP TABLE bench_batch_read_plans;
