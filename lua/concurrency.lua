-- Concurrency: mirrors algorithm::concurrency, with leases instead of a bare counter.
-- State: a sorted set with one member per slot held, "c<lease>:<n>" (lease = the request's
-- random 64-bit id), scored by the instant (us) the lease expires (acquire + lease TTL). A
-- gateway that dies mid-request never releases its slots; they stop counting when their lease
-- expires, and are purged on the next acquire. Normal completion runs release.lua, which
-- removes the request's members at once. The key expires with its newest lease.
-- p: cost, limit, lease, lease_ttl (us).
-- Returns allowed, remaining, reset, retry, delay (each wide: u, n; see wide.lua), charge.
local function concurrency(key, now, p)
  local usable, in_flight = zset_live(key, 'c', now)
  local charged = in_flight + p.cost
  if charged <= p.limit then
    return true, p.limit - charged, 0, 0, 0, 0, 0, 0, function()
      local expires = now + p.lease_ttl
      -- The key lives as long as its longest lease (another gateway's TTL may be longer).
      local newest = expires
      if usable then
        newest = newest_score(key) or expires
      end
      zset_charge(key, usable, 'c', now, expires, newest, p)
    end
  end
  -- A slot frees when some exchange ends, which cannot be predicted: one second, the smallest
  -- Retry-After a client can be told.
  return false, 0, 0, 0, 1000000, 0, 0, 0, nil
end
