//! The Lua code of the Redis store: the bodies of the functions of its
//! library (`FUNCTION LOAD`, called with `FCALL`; `library.rs` puts the
//! library together, each body in a function of `KEYS` and `ARGV`). Each
//! runs on one key (`KEYS[1]`), so it runs on Redis Cluster too. A
//! function costs the server less than an `EVALSHA` of the same script
//! (it is found by name, not by its SHA), and the library's shared code
//! runs once, when the library loads, not at each call.
//!
//! A claim is no function at all on the common path: `SET key value NX PX
//! ms GET` takes an absent key, or answers the record that stands, from
//! which the process decides ([`ClaimPlan`](crate::store::rules::ClaimPlan)).
//! The functions are what must read and write in one step: a claim that
//! replaces a record ([`SWAP`], only if the record is still the one the
//! claim read), and the completion, failure, release, extension and
//! deletion of a claim, which check its fencing token first.
//!
//! [`PRELUDE`] reads a record in either format (this release's string, or
//! an earlier release's hash, see `record.rs`) into one Lua table, and
//! writes the string format back; every function that checks a token uses
//! it, so a claim of an earlier release is completed, failed, released or
//! extended like any other. [`HASH_CLAIM`] is the claim of a key that still
//! holds a hash: the previous release's claim script, whose rules it keeps,
//! writing this release's format when it claims.

/// The library's shared code, run once when it loads: `parse(v, key)`,
/// `load(key, now)` and `encode(r)`, a record as a table with
/// `s` (status letter), `t` (token, `''` when none), `c`/`u` (created and
/// updated, as text), `l` (the end: of a claim's lease, or of a settled
/// record's window; text, or `nil` in a settled record written before its
/// end was kept), `a`/`f` (attempts
/// and failures, numbers), `e` (last error or `nil`), `p` (fingerprint,
/// `''` when none), `o` (outcome or `nil`) and `m` (the handler's
/// `max_attempts` as text, or `nil`: the rest of a record in progress or
/// waiting for a retry, which has no outcome) and `tr` (the `traceparent`
/// of a record in format 3, or `nil`). `untraced(v, k)` is a record's value
/// in format 2 and its trace, if any.
pub(crate) const PRELUDE: &str = r"
local function untraced(v, k)
  if string.sub(v, 1, 2) ~= '3|' then return v, nil end
  local tr, at = string.match(v, '^3|([^|]*)|()')
  if not tr then error('idem: the value of ' .. k .. ' is not a record') end
  return '2|' .. string.sub(v, at), tr
end
local function parse(v, k)
  local tr
  v, tr = untraced(v, k)
  local s, u, l, tl, at = string.match(v, '^2|(%a)|([^|]*)|([^|]*)|([^|]*)|()')
  tl = tonumber(tl)
  if not tl then error('idem: the value of ' .. k .. ' is not a record') end
  local t = string.sub(v, at, at + tl - 1)
  local c, a, f, pl, el, bt = string.match(v, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|()', at + tl)
  a, f, pl = tonumber(a), tonumber(f), tonumber(pl)
  if not (s and a and f and pl) then
    error('idem: the value of ' .. k .. ' is not a record')
  end
  local r = {s = s, u = u, t = t, c = c, a = a, f = f, tr = tr}
  if l ~= '' then r.l = l end
  r.p = string.sub(v, bt, bt + pl - 1)
  bt = bt + pl
  if el ~= '' then
    el = tonumber(el)
    r.e = string.sub(v, bt, bt + el - 1)
    bt = bt + el
  end
  if s == 'c' or s == 'f' then
    r.o = string.sub(v, bt)
  elseif bt <= #v then
    r.m = string.sub(v, bt)
  end
  return r
end
local letters = {in_progress = 'p', completed = 'c', failed = 'f', retry = 'r'}
local function load(k, now)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then
    local h = redis.call('HMGET', k, 's', 't', 'o', 'c', 'u', 'l', 'a', 'f', 'e', 'p')
    if not h[1] then return nil end
    local r = {s = letters[h[1]] or '?', t = h[2] or '', c = h[4] or '0',
      a = tonumber(h[7]) or 1, f = tonumber(h[8]) or 0, p = h[10] or ''}
    r.u = h[5] or r.c
    if h[3] then r.o = h[3] end
    if h[9] then r.e = h[9] end
    if h[6] then r.l = h[6] end
    if r.s == 'p' and not r.l then
      r.l = tostring(tonumber(now) + redis.call('PTTL', k))
    end
    return r
  end
  if not v then return nil end
  return parse(v, k)
end
local function expiring(ms)
  local t = redis.call('TIME')
  return string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ms))
end
local function encode(r)
  local e = r.e
  local rest = r.m
  if r.s == 'c' or r.s == 'f' then rest = r.o end
  local tag = '2|'
  if r.tr and r.tr ~= '' then tag = '3|' .. r.tr .. '|' end
  return tag .. r.s .. '|' .. r.u .. '|' .. (r.l or '') .. '|' .. #r.t .. '|' .. r.t ..
    r.c .. '|' .. string.format('%d|%d|%d|', r.a, r.f, #r.p) .. (e and #e or '') .. '|' ..
    r.p .. (e or '') .. (rest or '')
end
";

/// Writes `ARGV[2]` for `ARGV[3]` ms if the key still holds `ARGV[1]`
/// (`''`: if it is still absent). With `ARGV[4]` `1`, `ARGV[2]` is a
/// settled record: its end is written as the moment Redis expires it (as
/// a completion's), and the key expires then. Replies `{1}` written,
/// `{0, value}` not written with what the key holds now (nil: nothing),
/// `{2}` the key holds a hash.
pub(crate) const SWAP: &str = r"
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then return {2} end
if (v or '') ~= ARGV[1] then return {0, v} end
if ARGV[4] == '1' then
  local head, tail = string.match(ARGV[2], '^(2|%a|[^|]*|)[^|]*(|.*)$')
  if not head then
    head, tail = string.match(ARGV[2], '^(3|[^|]*|%a|[^|]*|)[^|]*(|.*)$')
  end
  if not head then error('idem: not a record: ' .. ARGV[2]) end
  local e = expiring(ARGV[3])
  redis.call('SET', KEYS[1], head .. e .. tail, 'PXAT', e)
  return {1}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {1}
";

/// Completes the claim of token `ARGV[1]` with outcome `ARGV[2]`, kept for
/// `ARGV[3]` ms; `ARGV[4]` is now, `ARGV[5]` the `traceparent` of the
/// execution (empty: none; the record is then written in format 2). The record is written with its end,
/// the moment Redis expires it (by the server's clock, `expiring`), and
/// the key is set to expire then (`PXAT`). Returns 1, or 0 when another claim holds
/// the key or completed it. A key that expired with nobody taking it over
/// is recorded all the same, as the SQL stores do: the body's effect
/// happened. Failures and the last error stay: a success resets nothing.
/// The completed record keeps the token, so that a completion sent again
/// with it (its first reply lost) answers 1 and writes nothing.
///
/// The function is [`COMPLETE_KEY`] (a string record, [`COMPLETE_STRING`]),
/// then this: [`COMPLETE_ONE`] for one key, [`COMPLETE_MANY`] for a
/// batch's.
pub(crate) const COMPLETE: &str = r"
local r = load(KEYS[1], ARGV[4])
if r then
  if r.t ~= ARGV[1] then return 0 end
  if r.s == 'c' then return 1 end
  if r.s ~= 'p' and r.s ~= 'r' then return 0 end
else
  r = {c = ARGV[4], a = 1, f = 0, p = ''}
end
r.s, r.t, r.u, r.l, r.o, r.tr = 'c', ARGV[1], ARGV[4], expiring(ARGV[3]), ARGV[2], ARGV[5]
redis.call('SET', KEYS[1], encode(r), 'PXAT', r.l)
return 1
";

/// The common case of [`COMPLETE`], a string record `v` of key `k`, read
/// with one `string.match` of its head and one of its tail's lengths: a
/// claim (in progress, or a stall counted as the last failure) has no
/// outcome yet, so the completed record is a new head with the same token,
/// the old tail up to the end of its last error (what follows is the
/// handler's `max_attempts`, which a completed record does not keep), and
/// the outcome. A record this token completed already answers 1 as it is.
/// The record's end is `e`, or, when `nil`, `ttl` ms from the server's
/// now. `tr` is the execution's `traceparent` (empty: none), written as
/// format 3 writes it. The library's local function `complete_string(k,
/// v, token, outcome, ttl, now, e, tr)`; a completion calls it for a
/// string record, and [`COMPLETE`] for an absent key or a hash.
pub(crate) const COMPLETE_STRING: &str = r"
local function complete_string(k, v, token, outcome, ttl, now, e, tr)
  v = untraced(v, k)
  local s, ts, tl, at = string.match(v, '^2|(%a)|[^|]*|[^|]*|()(%d+)|()')
  if not tl then error('idem: the value of ' .. k .. ' is not a record') end
  tl = tonumber(tl)
  if tl == 0 or string.sub(v, at, at + tl - 1) ~= token then return 0 end
  if s == 'c' then return 1 end
  if s ~= 'p' and s ~= 'r' then return 0 end
  local pl, el, bt = string.match(v, '^[^|]*|[^|]*|[^|]*|(%d+)|(%d*)|()', at + tl)
  if not pl then error('idem: the value of ' .. k .. ' is not a record') end
  local ends = bt + tonumber(pl) + (tonumber(el) or 0) - 1
  e = e or expiring(ttl)
  local tag = '2|'
  if tr and tr ~= '' then tag = '3|' .. tr .. '|' end
  redis.call('SET', k, tag .. 'c|' .. now .. '|' .. e .. '|' .. string.sub(v, ts, ends) .. outcome,
    'PXAT', e)
  return 1
end
";

/// The completion of one key, as [`COMPLETE`] says: the library's local
/// function `complete(KEYS, ARGV)`, [`COMPLETE_STRING`] for a string
/// record, [`COMPLETE`] otherwise.
pub(crate) const COMPLETE_KEY: &str = r"
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
  return complete_string(KEYS[1], v, ARGV[1], ARGV[2], ARGV[3], ARGV[4], nil, ARGV[5])
end
";

/// A completion of one key: the library's `complete`.
pub(crate) const COMPLETE_ONE: &str = r"
return complete(KEYS, ARGV)
";

/// The completions of a batch, one call for its keys (`KEYS`, all of them
/// in one slot on a cluster): `ARGV[1]` is how long each completed record
/// is kept, in ms, `ARGV[2]` now, `ARGV[3]` the execution's
/// `traceparent` (empty: none), then the token and the outcome of each
/// key in turn. Each key is completed as [`COMPLETE`] completes one, the
/// records' end read from the server's clock once for all of them (the
/// call runs at one moment); replies each one's answer, in order.
pub(crate) const COMPLETE_MANY: &str = r"
local ttl, now, tr = ARGV[1], ARGV[2], ARGV[3]
local e = expiring(ttl)
local done = {}
for i = 1, #KEYS do
  local k = KEYS[i]
  local v = redis.pcall('GET', k)
  if type(v) == 'string' then
    done[i] = complete_string(k, v, ARGV[2 * i + 2], ARGV[2 * i + 3], ttl, now, e, tr)
  else
    done[i] = complete({k}, {ARGV[2 * i + 2], ARGV[2 * i + 3], ttl, now, tr})
  end
end
return done
";

/// Records a failure under the claim of token `ARGV[1]`: status letter
/// `ARGV[2]` (`r` retry or `f` failed), recorded error `ARGV[3]` (JSON, or
/// empty), text `ARGV[4]`, kept for `ARGV[5]` ms (its end written, and
/// the key expiring then, as a completion's); `ARGV[6]` is now, `ARGV[7]`
/// the execution's `traceparent` (empty: none). Returns 1, or 0 when the token no longer holds the key (a completed
/// record keeps the token of the claim that completed it: no failure is
/// recorded over it).
pub(crate) const FAIL: &str = r"
local r = load(KEYS[1], ARGV[6])
if not r or r.t ~= ARGV[1] or (r.s ~= 'p' and r.s ~= 'r') then return 0 end
r.s, r.t, r.u, r.l, r.f, r.e = ARGV[2], '', ARGV[6], expiring(ARGV[5]), r.f + 1, ARGV[4]
if ARGV[3] ~= '' then r.o = ARGV[3] else r.o = nil end
r.tr = ARGV[7]
redis.call('SET', KEYS[1], encode(r), 'PXAT', r.l)
return 1
";

/// Deletes the record if token `ARGV[1]` still holds it in progress;
/// `ARGV[2]` is now.
pub(crate) const RELEASE: &str = r"
local r = load(KEYS[1], ARGV[2])
if not r or r.t ~= ARGV[1] or r.s ~= 'p' then return 0 end
redis.call('DEL', KEYS[1])
return 1
";

/// Extends the lease of token `ARGV[1]` at `ARGV[2]` (now) to end at
/// `ARGV[3]`, while the claim is in progress: the key lives `ARGV[4]` ms
/// (the lease), or `ARGV[5]` ms (the lease and a ttl) for a claim that
/// carries failures or whose handler counts them (`ARGV[6]` is `1`), so
/// that a consumer that stops inside it is counted.
pub(crate) const EXTEND: &str = r"
local r = load(KEYS[1], ARGV[2])
if not r or r.t ~= ARGV[1] or r.s ~= 'p' then return 0 end
r.u, r.l = ARGV[2], ARGV[3]
local px = ARGV[4]
if r.f > 0 or ARGV[6] == '1' then px = ARGV[5] end
redis.call('SET', KEYS[1], encode(r), 'PX', px)
return 1
";

/// Deletes the record `KEYS[1]` unless `ARGV[1]` is `0` (not forced) and
/// a live claim holds it: in progress, its lease not over at `ARGV[2]`
/// (now, ms). Returns 1 deleted, 0 absent, 2 refused.
pub(crate) const FORGET: &str = r"
local r = load(KEYS[1], ARGV[2])
if not r then return 0 end
if ARGV[1] == '0' and r.s == 'p' and tonumber(r.l or '0') > tonumber(ARGV[2]) then
  return 2
end
redis.call('DEL', KEYS[1])
return 1
";

/// The claim of a key that holds a hash of an earlier release: its rules
/// are the previous release's claim script's, unchanged. Claims `KEYS[1]`
/// with token `ARGV[1]` for a lease of `ARGV[2]` ms; `ARGV[3]` is now
/// (ms), `ARGV[4]` the delivery's fingerprint (or empty), `ARGV[5]` the
/// handler's `max_attempts` (or empty), `ARGV[6]` its ttl (ms), `ARGV[7]`
/// the last error a claim whose lease ran out leaves.
///
/// A claim that ran out counts as a failure while its lease ended less
/// than a ttl ago; a claim of a handler with `max_attempts`, or one that
/// carries failures, lives for its lease and a ttl, so that a consumer
/// that stops inside it is counted. A claim that takes the key writes this
/// release's string format; a refusal leaves the hash as it is, and so
/// does the count of a stall that exhausts the key (it keeps its token).
///
/// Replies `{1}` claimed, `{2, outcome}` completed, `{3, ms left}` in
/// progress, `{4, fingerprint}` recorded with another payload, `{5, error}`
/// failed for good, `{6, failures, last error}` exhausted, `{7, value}`
/// the key holds no hash (any more): its string value, or nil.
///
/// A hash written by the first release has no `l` (lease end), `a`, `f`,
/// `e` or `p`: its lease ends with the key's TTL, and it carries one
/// attempt, no failure and no fingerprint.
pub(crate) const HASH_CLAIM: &str = r"
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  return {7, redis.call('GET', KEYS[1])}
end
local h = redis.call('HMGET', KEYS[1], 's', 'o', 'p', 'f', 'e', 'l', 'a')
local now = tonumber(ARGV[3])
local lease = tonumber(ARGV[2])
local s = h[1]
local attempts, failures, last_error = 1, 0, false
if s then
  local left, ends = nil, nil
  if s == 'in_progress' then
    ends = tonumber(h[6]) or (now + redis.call('PTTL', KEYS[1]))
    left = ends - now
  end
  if left == nil or left > 0 then
    if h[3] and ARGV[4] ~= '' and h[3] ~= ARGV[4] then return {4, h[3]} end
    if s == 'completed' then return {2, h[2]} end
    if s == 'failed' then return {5, h[2]} end
    if s == 'in_progress' then return {3, left} end
    local f = tonumber(h[4]) or 0
    if ARGV[5] ~= '' and f >= tonumber(ARGV[5]) then return {6, f, h[5]} end
    attempts, failures, last_error = (tonumber(h[7]) or 1) + 1, f, h[5]
  elseif ends + tonumber(ARGV[6]) > now then
    attempts = (tonumber(h[7]) or 1) + 1
    failures = (tonumber(h[4]) or 0) + 1
    last_error = ARGV[7]
    if ARGV[5] ~= '' and failures >= tonumber(ARGV[5]) then
      redis.call('HSET', KEYS[1], 's', 'retry', 'f', failures, 'e', last_error, 'u', ARGV[3])
      redis.call('HDEL', KEYS[1], 'l')
      redis.call('PEXPIRE', KEYS[1], ARGV[6])
      return {6, failures, last_error}
    end
  end
end
local r = {s = 'p', t = ARGV[1], c = ARGV[3], u = ARGV[3], l = string.format('%d', now + lease),
  a = attempts, f = failures, p = ARGV[4]}
if last_error then r.e = last_error end
if ARGV[5] ~= '' then r.m = ARGV[5] end
local px = lease
if failures > 0 or ARGV[5] ~= '' then px = lease + tonumber(ARGV[6]) end
redis.call('SET', KEYS[1], encode(r), 'PX', px)
return {1}
";
