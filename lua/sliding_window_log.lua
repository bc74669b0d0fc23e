-- Sliding window log: mirrors algorithm::sliding_window_log. Exact: at most `limit` units in
-- any interval of one window.
-- State: a sorted set with one member per admitted unit, scored by the instant (us) it stops
-- counting (admission + window). Members are "l<lease>:<n>": the lease is the request's random
-- 64-bit id, so members never collide. Entries that stopped counting are purged on every
-- call, so the set never holds more than `limit` (the largest limit it was used with) members.
-- The key expires when its newest entry stops counting.
-- p: cost, limit (already capped at MAX_SLIDING_LOG_LIMIT), window (us), lease.
-- Every duration is whole microseconds (a wide number with no nanoseconds).
local function sliding_window_log(key, now, p)
  local quota = p.limit
  local usable, live = zset_live(key, 'l', now)
  local last = now
  if live > 0 then
    last = math.max(now, newest_score(key) or now)
  end
  local charged = live + p.cost
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
  -- The cost fits once the (charged - quota) oldest live entries have stopped counting.
  local index = charged - quota - 1
  local entry = redis.call('ZRANGE', key, index, index, 'WITHSCORES')
  local retry = p.window
  if entry[2] ~= nil then
    retry = math.max(0, tonumber(entry[2]) - now)
  end
  return false, 0, reset, 0, retry, 0, 0, 0, nil
end
