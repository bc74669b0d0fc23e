-- Sliding window log: mirrors algorithm::sliding_window_log. Exact: at most `limit` units in
-- any interval of one window.
-- State: a sorted set with one member per admitted unit, scored by the instant (us) it stops
-- counting (admission + window). Members are "l<lease>:<n>": the lease is the request's random
-- 64-bit id, so members never collide. Entries that stopped counting are purged on every
-- call, so the set never holds more than `limit` (the largest limit it was used with) members.
-- The key expires when its newest entry stops counting. Extra charges of true-ups are a debt
-- beside it (log_debt in common.lua), counted with the live entries while it lasts.
-- p: cost, limit (already capped at MAX_SLIDING_LOG_LIMIT), window (us), lease.
-- Every duration is whole microseconds (a wide number with no nanoseconds).
local function sliding_window_log(key, now, p)
  local quota = p.limit
  local usable, units = zset_live(key, 'l', now)
  local debt, debt_until = 0, 0
  if usable then
    debt, debt_until = log_debt(key, now)
  end
  local last = now
  if units > 0 then
    last = math.max(now, newest_score(key) or now)
  end
  if debt > 0 then
    last = math.max(last, debt_until)
  end
  local charged = units + debt + p.cost
  if charged <= quota then
    local expires = now + p.window
    local newest = last
    if p.cost > 0 then
      newest = expires
    end
    return true, quota - charged, newest - now, 0, 0, 0, 0, 0, function()
      -- Entries admitted under a longer window (before a reload) may outlive this one.
      zset_charge(key, usable, 'l', now, expires, last, p)
    end
  end
  local reset = last - now
  if p.cost > quota then
    return false, 0, reset, 0, p.window, 0, 0, 0, nil
  end
  -- When the n oldest live entries have stopped counting (nil: there are not that many).
  local function after(n)
    if n <= 0 then
      return now
    end
    local entry = redis.call('ZRANGE', key, n - 1, n - 1, 'WITHSCORES')
    if entry[2] == nil then
      return nil
    end
    return tonumber(entry[2])
  end
  -- The cost fits once enough of the oldest live entries have stopped counting: while the
  -- debt lasts, units + debt + cost - quota of them; once it has ended, units + cost - quota
  -- (and not before its end). The earlier of the two that exists.
  local room = quota - p.cost
  local best = nil
  if debt <= room then
    best = after(units - (room - debt))
  end
  if debt > 0 then
    local past = after(units - room)
    if past ~= nil then
      past = math.max(past, debt_until)
      if best == nil or past < best then
        best = past
      end
    end
  end
  local retry = p.window
  if best ~= nil then
    retry = math.max(0, best - now)
  end
  return false, 0, reset, 0, retry, 0, 0, 0, nil
end
