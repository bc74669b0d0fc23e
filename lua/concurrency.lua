-- Concurrency: mirrors algorithm::concurrency, with leases instead of a bare counter.
-- State: a sorted set with one member per slot held, "c<lease>:<n>" (lease = the request's
-- random 64-bit id), scored by the instant (us) the lease expires (acquire + lease TTL). A
-- gateway that dies mid-request never releases its slots; they stop counting when their lease
-- expires, and are purged on the next acquire. Normal completion runs release.lua, which
-- removes the request's members at once. The key expires with its newest lease.
-- p: cost, limit, lease, lease_ttl (us).
local function concurrency(key, now, p)
  local usable = zset_usable(key, 'c')
  local in_flight = 0
  if usable then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
    in_flight = redis.call('ZCARD', key)
  end
  local charged = in_flight + p.cost
  if charged <= p.limit then
    return true, p.limit - charged, 0, 0, 0, function()
      if not usable then
        -- Another algorithm's state: charging replaces it, even with nothing (cost 0).
        redis.call('DEL', key)
      end
      if p.cost == 0 then
        return
      end
      local expires = now + p.lease_ttl
      zadd_members(key, expires, 'c' .. p.lease .. ':', p.cost)
      local newest = math.max(expires, newest_score(key) or expires)
      redis.call('PEXPIRE', key, ttl_ms((newest - now) * 1000))
    end
  end
  -- A slot frees when some exchange ends, which cannot be predicted: one second, the smallest
  -- Retry-After a client can be told.
  return false, 0, 0, 1000000000, 0, nil
end
