-- floodgate: decides every global rule of one request atomically, in one call.
-- Composed at build time after common.lua, wide.lua, gcra.lua, the algorithm files and
-- algorithms.lua (the code table): one script, one SHA (see src/limiter/redis/script.rs), run
-- with EVALSHA.
--
-- KEYS[i]   the state key of check i: <key_prefix><rule>:{<16 hex digits of the key digest>}
-- ARGV[1]   the request's lease id (16 hex digits): names its log entries and its concurrency
--           slots, so release.lua can give the slots back
-- ARGV[2]   concurrency lease TTL, us
-- ARGV[3]   '' in production: "now" is Redis TIME, never a gateway clock. Tests may pass an
--           instant (us since the epoch) to compare decisions with the Rust reference at
--           chosen times; TTLs then get an hour of margin, as Redis expires keys in real time.
-- ARGV[4]   the call's tag (8 bytes the gateway drew for this call), which the reply starts
--           with: RESP matches replies to commands by order alone, and the gateway takes a
--           reply for its call's answer only when it carries the call's own tag
-- ARGV[4 + i] check i, packed little-endian (struct '<Bdddddddddd': one argument instead of
--           eleven, read by one C call instead of eleven tonumber()s; see unpack_check in
--           common.lua):
--           algorithm: 1 fixed window, 2 sliding log, 3 sliding counter, 4 token bucket,
--           5 leaky bucket police, 6 leaky bucket shape, 7 concurrency;
--           cost, limit, window (us), burst, interval (wide: us, ns), cap (wide: burst *
--           interval for the token bucket and leaky police, the longest wait min(max_delay,
--           burst * interval) for leaky shape), lease, share, all integers below 2^53.
--           lease: 0 for an exact check; otherwise the permits the gateway would like to lease
--           (at least cost). share: 2 x instances.
--           A calendar rule (fixed window only) appends four more doubles (113 bytes): the
--           boundaries of the previous, current and next periods around the gateway's time
--           (previous start, current start, next start, next end, us); see fixed_window.lua. A lease is granted from the authoritative
--           state: cost, plus at most floor(remaining / share) more (a fair share of what is
--           left, shrinking to single permits as the budget runs out), never more than lease.
--
-- ARGV[4 + #KEYS + i] optional: check i's block_for in ms (absent or 0: the rule does not
--           block). A key whose block key <key>:b lives is refused for what is left of it
--           without reading its state; a key the rule rejects gets the block key, PX block_for.
--
-- Every check is decided against the stored state first; only if every one admits is any of
-- them charged (all or nothing). Returns the tag, then 12 numbers per check, in KEYS order:
--   allowed (1/0), remaining, reset (wide: us, ns), retry_after (wide, 0 when allowed),
--   delay (wide), granted (permits charged: cost, or the lease), window_left (us until the
--   aligned window ends: fixed window and sliding counter, else 0), window_end (us, same
--   algorithms, else 0), now (us: when this call charged, which a refund, true-up or lease
--   return names so that it never lands on a counter a usage reset started since)
-- packed as little-endian doubles after the tag in one bulk string (all integers below 2^53, so exact): one
-- reply element instead of 12 per check, cheaper to produce here and to parse in the gateway.

local now
if ARGV[3] ~= nil and ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
  ttl_pad_ms = 3600000
else
  now = redis_now()
end

local lease = ARGV[1]
local lease_ttl = tonumber(ARGV[2])
local out = {}
local charges = {}
local blocks = {}
local n_keys = #KEYS
local admitted = true
for i, key in ipairs(KEYS) do
  local code, p, wanted, share = unpack_check(ARGV[4 + i], lease, lease_ttl)
  if code == nil then
    return redis.error_reply('floodgate: check ' .. i .. ' is not 81 or 113 packed bytes')
  end
  local decide = algorithms[code]
  if decide == nil then
    return redis.error_reply('floodgate: unknown algorithm ' .. code)
  end
  local cost, window = p.cost, p.window
  local allowed, remaining, reset_u, reset_n, retry_u, retry_n, delay_u, delay_n, charge
  -- block_for: a key its rule rejected is refused, before its state is read, until the
  -- block key (same hash tag, so the same cluster slot) expires.
  local block_ms = tonumber(ARGV[4 + n_keys + i] or '') or 0
  local blocked_ms = 0
  if block_ms > 0 then
    blocked_ms = math.max(0, redis.call('PTTL', key .. ':b'))
  end
  if blocked_ms > 0 then
    allowed, remaining, charge = false, 0, nil
    reset_u, reset_n, retry_u, retry_n = blocked_ms * 1000, 0, blocked_ms * 1000, 0
    delay_u, delay_n = 0, 0
  else
    allowed, remaining, reset_u, reset_n, retry_u, retry_n, delay_u, delay_n, charge =
      decide(key, now, p)
    if not allowed and block_ms > 0 then
      blocks[#blocks + 1] = { key, block_ms }
      -- The rejection that starts the block says to retry when it ends.
      if w_lt(retry_u, retry_n, block_ms * 1000, 0) then
        retry_u, retry_n = block_ms * 1000, 0
      end
      if w_lt(reset_u, reset_n, block_ms * 1000, 0) then
        reset_u, reset_n = block_ms * 1000, 0
      end
    end
  end
  local granted, window_left, window_end = cost, 0, 0
  if code == 1 then
    local _
    _, window_end = fw_window(now, p)
    window_left = window_end - now
  elseif code == 3 then
    local _, into = floor_div(now, window)
    window_end = now - into + window
    window_left = window_end - now
  end
  if allowed and wanted > cost then
    local extra = math.min(wanted - cost, math.floor(remaining / share))
    if extra >= 1 then
      -- Admitted by construction (extra <= remaining); checked all the same.
      p.cost = cost + extra
      local ok, r2, t2_u, t2_n, _, _, _, _, c2 = decide(key, now, p)
      if ok then
        granted, remaining, reset_u, reset_n, charge = p.cost, r2, t2_u, t2_n, c2
      end
      p.cost = cost
    end
  end
  if allowed then
    out[#out + 1] = 1
    charges[#charges + 1] = charge
  else
    out[#out + 1] = 0
    admitted = false
  end
  out[#out + 1] = remaining
  out[#out + 1] = reset_u
  out[#out + 1] = reset_n
  out[#out + 1] = retry_u
  out[#out + 1] = retry_n
  out[#out + 1] = delay_u
  out[#out + 1] = delay_n
  out[#out + 1] = granted
  out[#out + 1] = window_left
  out[#out + 1] = window_end
  out[#out + 1] = now
end

if admitted then
  for _, charge in ipairs(charges) do
    charge()
  end
end
for _, b in ipairs(blocks) do
  redis.call('SET', b[1] .. ':b', '1', 'PX', b[2])
end
return ARGV[4] .. struct.pack('<' .. string.rep('d', #out), unpack(out))
