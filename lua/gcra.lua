-- GCRA arithmetic shared by the token bucket and the leaky bucket (algorithm::gcra_police,
-- algorithm::gcra_shape, algorithm::backlog), in wide numbers (see wide.lua): a bucket's
-- interval, capacity and debt pass 2^53 ns when it refills over more than 104 days.
--
-- State: <tag>, <full_at, whole us>, <full_at, 0..999 ns>, <interval, whole us>,
-- <interval, 0..999 ns> (packed): the reference's `full_at` (token) / `tat` (leaky), the
-- instant the bucket is full / empty again, to the nanosecond, and the interval it was written
-- with. The key expires at that instant.

-- The bucket's state: full_at (us, ns) and interval (us, ns), or nothing. A state written by an
-- older floodgate (<written, us>, <debt, ns>, <interval, ns>, all below 2^53) reads as the same
-- instant and interval.
local function gcra_load(key, tag)
  local value = redis.pcall('GET', key)
  if type(value) ~= 'string' or string.byte(value, 1) ~= tag then
    return nil
  end
  if #value == 33 then
    local _, full_u, full_n, int_u, int_n = struct.unpack('<Bdddd', value)
    return full_u, full_n, int_u, int_n
  end
  if #value == 25 then
    local _, written, debt, interval = struct.unpack('<Bddd', value)
    local debt_u, debt_n = floor_div(debt, 1000)
    local int_u, int_n = floor_div(interval, 1000)
    return written + debt_u, debt_n, int_u, int_n
  end
  return nil
end

-- Stores a bucket that is full / empty again `(u, n)` from `now`, at interval `(int_u, int_n)`.
local function gcra_save(key, tag, now, u, n, int_u, int_n)
  save_fields(key, tag, u, n, now + u, n, int_u, int_n)
end

-- Time (wide) still to drain at `now`. A state written at another rate (a reload) keeps its
-- number of missing units, rounded up to whole ones and at most the rule's burst, at the
-- rule's interval.
local function gcra_backlog(key, tag, now, p)
  local full_u, full_n, stored_u, stored_n = gcra_load(key, tag)
  if not full_u then
    return 0, 0
  end
  local u, n = w_norm(full_u - now, full_n)
  if not w_pos(u, n) then
    return 0, 0
  end
  if (stored_u == p.int_u and stored_n == p.int_n) or not w_pos(stored_u, stored_n) then
    return u, n
  end
  local units = p.burst
  -- The doubles' ratio is close: only a ratio that may be at most burst is computed exactly.
  if (u * 1000 + n) / (stored_u * 1000 + stored_n) < 2 * p.burst + 2 then
    units = math.min(w_ceil_div(u, n, stored_u, stored_n), p.burst)
  end
  return w_mul(units, p.int_u, p.int_n)
end

-- Police: admitted if the debt plus cost * interval fits the capacity (burst * interval).
-- p: cost, burst, window (us), interval (wide), cap = burst * interval (wide).
-- Returns allowed, remaining, reset, retry, delay (each wide: u, n), charge.
local function gcra_police(key, tag, now, p)
  local debt_u, debt_n = gcra_backlog(key, tag, now, p)
  local cost_u, cost_n = w_mul(p.cost, p.int_u, p.int_n)
  local charged_u, charged_n = w_add(debt_u, debt_n, cost_u, cost_n)
  if w_le(charged_u, charged_n, p.cap_u, p.cap_n) then
    -- Whole tokens (free places) left.
    local left_u, left_n = w_sub(p.cap_u, p.cap_n, charged_u, charged_n)
    local remaining = w_div(left_u, left_n, p.int_u, p.int_n)
    return true, remaining, charged_u, charged_n, 0, 0, 0, 0, function()
      gcra_save(key, tag, now, charged_u, charged_n, p.int_u, p.int_n)
    end
  end
  if p.cost > p.burst then
    return false, 0, debt_u, debt_n, p.window, 0, 0, 0, nil
  end
  local retry_u, retry_n = w_sub(charged_u, charged_n, p.cap_u, p.cap_n)
  return false, 0, debt_u, debt_n, retry_u, retry_n, 0, 0, nil
end

-- Shape: the request departs at the next free slot, after `delay`; admitted while
-- delay <= longest wait = min(max_delay, burst * interval).
-- p: cost, burst, interval (wide), cap = longest wait (wide).
local function gcra_shape(key, tag, now, p)
  local delay_u, delay_n = gcra_backlog(key, tag, now, p)
  if w_le(delay_u, delay_n, p.cap_u, p.cap_n) then
    local cost_u, cost_n = w_mul(p.cost, p.int_u, p.int_n)
    local line_u, line_n = w_add(delay_u, delay_n, cost_u, cost_n)
    local remaining = 0
    if w_le(line_u, line_n, p.cap_u, p.cap_n) then
      local left_u, left_n = w_sub(p.cap_u, p.cap_n, line_u, line_n)
      remaining = math.min(w_div(left_u, left_n, p.int_u, p.int_n) + 1, p.burst)
    end
    return true, remaining, line_u, line_n, 0, 0, delay_u, delay_n, function()
      gcra_save(key, tag, now, line_u, line_n, p.int_u, p.int_n)
    end
  end
  local retry_u, retry_n = w_sub(delay_u, delay_n, p.cap_u, p.cap_n)
  return false, 0, delay_u, delay_n, retry_u, retry_n, 0, 0, nil
end

-- Settling a bucket (true_up.lua, lease_return.lua; code 4 token bucket, 5 leaky bucket): its
-- tag and the debt (wide) left at `now`, below zero when it has drained, while its state was
-- written at the interval `(int_u, int_n)` the charge was made at; nil otherwise (no state, or a
-- reload changed the rate: the charge's units are no longer the state's).
local function gcra_charged_debt(key, code, now, int_u, int_n)
  local tag = TAG_TB
  if code == 5 then
    tag = TAG_LB
  end
  local full_u, full_n, stored_u, stored_n = gcra_load(key, tag)
  if not (full_u and stored_u == int_u and stored_n == int_n) then
    return nil
  end
  local u, ns = w_norm(full_u - now, full_n)
  return tag, u, ns
end
