-- floodgate: helpers shared by every algorithm (concatenated first; see src/limiter/redis/script.rs).
--
-- Units. Redis scripts compute in Lua 5.1 numbers, which are doubles: integers are exact only
-- below 2^53. Nanoseconds since the Unix epoch (~1.7e18) are not, nor are nanosecond durations
-- past 104 days, so:
--   * instants (now, window ends, log entry expiries, lease expiries) are MICROSECONDS since the
--     epoch (~1.7e15 < 2^53), which is also the resolution of Redis TIME;
--   * the windows' durations are whole microseconds too (config durations are whole
--     milliseconds), so that `window_ns = window_us * 1000` exactly;
--   * durations the reference computes to the nanosecond (a bucket's interval, debt and
--     capacity, a sliding counter's wait) are WIDE: two numbers, whole microseconds and 0..999
--     nanoseconds (see wide.lua), exact up to 2^53 us (285 years);
--   * products that pass 2^53 (a sliding counter's count x window) go through mul_div, which
--     never forms them.
-- Validation keeps every rule within this (windows and a bucket's refill time at most ten
-- years, limits and bursts at most 10^15), so every decision equals the Rust reference
-- (src/limiter/algorithm.rs) evaluated at `now_ns = now_us * 1000`, bit for bit.

-- An integer formatted without exponent: tostring() would print 1.7e+15 and lose digits.
local function fmt(n)
  return string.format('%.0f', n)
end

-- floor(a / b) and a mod b for integers 0 <= a, 0 < b below 2^53, exactly: the float quotient
-- can be one off when it is large, and the remainder check puts it right.
local function floor_div(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  while r < 0 do
    q = q - 1
    r = r + b
  end
  while r >= b do
    q = q + 1
    r = r - b
  end
  return q, r
end

-- ceil(a / b), exactly (same domain as floor_div).
local function ceil_div(a, b)
  local q, r = floor_div(a, b)
  if r > 0 then
    q = q + 1
  end
  return q
end

-- Milliseconds of TTL for a state that stops mattering `us` microseconds and `ns` (0..999)
-- nanoseconds from now: rounded up (a key must never vanish while a decision still depends on
-- it), at least 1. `ttl_pad_ms` is 0 in production; tests that inject the time add a margin
-- (see decide.lua).
local ttl_pad_ms = 0
local function ttl_ms(us, ns)
  if ns > 0 then
    us = us + 1
  end
  local ms = ceil_div(us, 1000)
  if ms < 1 then
    ms = 1
  end
  -- A number: redis.call formats it with %.17g, exact for any integer below 2^53.
  return ms + ttl_pad_ms
end

-- String states are packed binary: one tag byte naming the algorithm, then `count` doubles
-- (struct.pack '<B' .. 'd' * count). A double holds every field exactly (instants in us, counts,
-- the two halves of a wide number: see above), and packing costs a tenth of formatting and
-- parsing decimal text, which was most of a script's time.
local TAG_FW, TAG_SWC, TAG_TB, TAG_LB = 1, 2, 3, 4
local STATE_FORMAT = { '<Bd', '<Bdd', '<Bddd', '<Bdddd' }

-- The numeric fields of the state at `key`, as `count` values (followed by one more that
-- callers ignore); nothing (nil) when the key is absent or holds another algorithm's state (the
-- rule changed on reload: treated as no state, and overwritten by SET when charged).
local function load_fields(key, tag, count)
  local value = redis.pcall('GET', key)
  if type(value) ~= 'string' or #value ~= 1 + 8 * count or string.byte(value, 1) ~= tag then
    return nil
  end
  return select(2, struct.unpack(STATE_FORMAT[count], value))
end

-- Stores the state `...` that stops mattering `us` microseconds and `ns` (0..999) nanoseconds
-- from now. A state that already stopped mattering is equivalent to no state: the key is
-- deleted instead.
local function save_fields(key, tag, us, ns, ...)
  if us < 0 or (us == 0 and ns <= 0) then
    redis.call('DEL', key)
    return
  end
  redis.call('SET', key, struct.pack(STATE_FORMAT[select('#', ...)], tag, ...), 'PX', ttl_ms(us, ns))
end

-- Whether `key` holds a sorted set of this kind (members start with `tag`: 'l' sliding log,
-- 'c' concurrency leases) or nothing. False: another algorithm's state (a reload changed the
-- rule), treated as no state and deleted when charged.
local function zset_usable(key, tag)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then
    return true
  end
  if kind ~= 'zset' then
    return false
  end
  local first = redis.call('ZRANGE', key, 0, 0)
  return first[1] == nil or string.sub(first[1], 1, 1) == tag
end

-- ZADD of `count` members `prefix..i` with one score, in batches: unpack() of a very long list
-- would overflow the Lua C stack.
local function zadd_members(key, score, prefix, count)
  local s = fmt(score)
  local i = 1
  while i <= count do
    local args = {}
    local last = math.min(count, i + 499)
    for j = i, last do
      args[#args + 1] = s
      args[#args + 1] = prefix .. j
    end
    redis.call('ZADD', key, unpack(args))
    i = last + 1
  end
end

-- Score of the newest member of a sorted set (its last expiry), or nil when empty.
local function newest_score(key)
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] == nil then
    return nil
  end
  return tonumber(newest[2])
end

-- A sorted-set state of kind `tag` at `now`: whether `key` can hold it (see zset_usable), and
-- how many members still count. Members whose expiry is <= now no longer count: they are
-- removed first, which changes no decision.
local function zset_live(key, tag, now)
  if not zset_usable(key, tag) then
    return false, 0
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
  return true, redis.call('ZCARD', key)
end

-- Charges a sorted-set state: `p.cost` members "<tag><lease>:<n>" expiring at `expires`; the
-- key lives until `newest` or `expires`, whichever is later. Another algorithm's state
-- (`usable` false) is replaced, even by nothing (cost 0).
local function zset_charge(key, usable, tag, now, expires, newest, p)
  if not usable then
    redis.call('DEL', key)
  end
  if p.cost == 0 then
    return
  end
  zadd_members(key, expires, tag .. p.lease .. ':', p.cost)
  redis.call('PEXPIRE', key, ttl_ms(math.max(expires, newest) - now, 0))
end

-- A sliding log's debt: extra charges of true-ups, `units` that count until `until` (us),
-- kept beside the log in <key>:d (same hash tag, so the same cluster slot) as packed '<dd'
-- with a TTL, rather than as one member per unit (a hostile upstream's cost would make a huge
-- set). Mirrors algorithm::Log. 0, 0 when there is none that still counts.
local MAX_LOG_DEBT = 1000001
local function log_debt(key, now)
  local value = redis.pcall('GET', key .. ':d')
  if type(value) ~= 'string' or #value ~= 16 then
    return 0, 0
  end
  local units, until_us = struct.unpack('<dd', value)
  if until_us <= now then
    return 0, 0
  end
  return units, until_us
end

-- Owes `extra` more units until `until_us`, merged into the debt: the sum (at most
-- MAX_LOG_DEBT, which already refuses everything) until the later end (see algorithm::Log).
local function log_owe(key, now, extra, until_us)
  local units, stored = log_debt(key, now)
  units = math.min(units + extra, MAX_LOG_DEBT)
  until_us = math.max(stored, until_us)
  redis.call('SET', key .. ':d', struct.pack('<dd', units, until_us), 'PX', ttl_ms(until_us - now, 0))
end

-- Whether a charge made at `charged_at` (us, Redis time; 0: unknown) belongs to the current
-- epoch of `key`: made after the key's last usage reset, whose start <key>:e holds (see
-- usage.lua). A refund, true-up or lease return of an older charge must not land on the new
-- counter. A charge in the reset's very microsecond, or of unknown time, counts as older:
-- dropping a refund costs availability, applying a stale one exactness.
local function same_epoch(key, charged_at)
  local started = redis.call('GET', key .. ':e')
  if not started then
    return true
  end
  return charged_at > (tonumber(started) or 0)
end

-- Now, in us since the epoch, by Redis TIME: one clock for every gateway (see Units above).
local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A check as decide.lua receives it in ARGV[4 + i] and usage.lua in ARGV[3]: 81 packed bytes,
-- or 113 with a calendar rule's periods (see decide.lua). Returns the algorithm code, the
-- parameters `p` the algorithm's function reads (cost as packed; `lease` and `lease_ttl` are
-- the call's, not the check's), the permits wanted and the share; nil when the size is wrong,
-- which each caller reports in its own words.
local function unpack_check(packed, lease, lease_ttl)
  if packed == nil or (#packed ~= 81 and #packed ~= 113) then
    return nil
  end
  local code, cost, limit, window, burst, int_u, int_n, cap_u, cap_n, wanted, share =
    struct.unpack('<Bdddddddddd', packed)
  local periods = nil
  if #packed == 113 then
    periods = { struct.unpack('<dddd', packed, 82) }
  end
  local p = {
    cost = cost,
    limit = limit,
    window = window,
    burst = burst,
    int_u = int_u,
    int_n = int_n,
    cap_u = cap_u,
    cap_n = cap_n,
    lease = lease,
    lease_ttl = lease_ttl,
    periods = periods,
  }
  return code, p, wanted, share
end

-- Settling (true_up.lua, lease_return.lua) undoes or adds to a charge only in the window it was
-- charged in, while that window still counts: never in another, which the charge never
-- touched. These say whether it still does.

-- A fixed window's count at `key` while the window that ends at `window_end` is the current one
-- at `now`; nil once it has ended (a permit of an ended window is worth nothing).
local function fw_charged_count(key, window_end, now)
  local stored_end, count = load_fields(key, TAG_FW, 2)
  if stored_end == window_end and window_end > now then
    return count
  end
  return nil
end

-- A sliding counter's state at `key` (expires, prev, cur) while a charge made in the window
-- that ends at `window_end` still counts at `now`, and whether that window has moved on: false
-- while it is the current one (the charge is in cur), true in the next window (it is in prev,
-- and still weighs). Nil once it no longer counts.
local function swc_charged(key, window_end, window, now)
  local expires, prev, cur = load_fields(key, TAG_SWC, 3)
  if expires and expires == window_end + window and window_end > now then
    return expires, prev, cur, false
  end
  if expires and expires == window_end + 2 * window and window_end + window > now then
    return expires, prev, cur, true
  end
  return nil
end
