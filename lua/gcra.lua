-- GCRA arithmetic shared by the token bucket and the leaky bucket (algorithm::gcra_police,
-- algorithm::gcra_shape, algorithm::backlog).
--
-- State: <tag>, <written at, us>, <debt, ns>, <interval, ns> (packed). The reference stores the
-- absolute instant `full_at` (token) / `tat` (leaky) in nanoseconds, which a double cannot
-- hold exactly; `written_at * 1000 + debt` is that same instant, kept exact as two numbers.
-- The key expires when the debt is paid off (the bucket is full / empty again).

-- Time (ns) still to drain at `now`, converted to the rule's current interval if the state
-- was written at another rate (a reload): the number of units is kept, rounded up. The
-- conversion is exact while interval * stored_interval < 2^53; past that it is off by at
-- most a few ns (reloads only).
local function gcra_backlog(key, tag, now, p)
  local written, debt, stored = load_fields(key, tag, 3)
  if not written then
    return 0
  end
  local backlog = debt + (written - now) * 1000
  if backlog <= 0 then
    return 0
  end
  if stored == p.interval or stored <= 0 then
    return backlog
  end
  return mul_ceil_div(backlog, p.interval, stored)
end

-- Police: admitted if the debt plus cost * interval fits the capacity (burst * interval).
-- p: cost, burst, window (us), interval (ns), cap = burst * interval (ns).
local function gcra_police(key, tag, now, p)
  local debt = gcra_backlog(key, tag, now, p)
  local charged = debt + p.cost * p.interval
  if charged <= p.cap then
    -- Whole tokens (free places) left.
    local remaining = floor_div(p.cap - charged, p.interval)
    return true, remaining, charged, 0, 0, function()
      save_fields(key, tag, charged, now, charged, p.interval)
    end
  end
  local retry = charged - p.cap
  if p.cost > p.burst then
    retry = p.window * 1000
  end
  return false, 0, debt, retry, 0, nil
end

-- Shape: the request departs at the next free slot, after `delay`; admitted while
-- delay <= longest wait = min(max_delay, burst * interval).
-- p: cost, burst, interval (ns), cap = longest wait (ns).
local function gcra_shape(key, tag, now, p)
  local delay = gcra_backlog(key, tag, now, p)
  local longest = p.cap
  if delay <= longest then
    local line = delay + p.cost * p.interval
    local remaining = 0
    if line <= longest then
      remaining = math.min(floor_div(longest - line, p.interval) + 1, p.burst)
    end
    return true, remaining, line, 0, delay, function()
      save_fields(key, tag, line, now, line, p.interval)
    end
  end
  return false, 0, delay, delay - longest, 0, nil
end
