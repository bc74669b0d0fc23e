-- floodgate: decides every global rule of one request atomically, in one call.
-- Composed at build time after common.lua, gcra.lua and the algorithm files (one script, one
-- SHA; see src/limiter/redis.rs), and run with EVALSHA.
--
-- KEYS[i]   the state key of check i: <key_prefix><rule>:{<16 hex digits of the key digest>}
-- ARGV[1]   the request's lease id (16 hex digits): names its log entries and its concurrency
--           slots, so release.lua can give the slots back
-- ARGV[2]   concurrency lease TTL, us
-- ARGV[3]   '' in production: "now" is Redis TIME, never a gateway clock. Tests may pass an
--           instant (us since the epoch) to compare decisions with the Rust reference at
--           chosen times; TTLs then get an hour of margin, as Redis expires keys in real time.
-- ARGV[3 + 7 * (i - 1) + 1 .. 7] for check i:
--           algorithm: fw | swl | swc | tb | lbp (leaky police) | lbs (leaky shape) | cc
--           cost, limit, window (us), burst, interval (ns), cap (ns: burst * interval for tb and
--           lbp, the longest wait min(max_delay, burst * interval) for lbs)
--
-- Every check is decided against the stored state first; only if every one admits is any of
-- them charged (all or nothing). Returns 5 numbers per check, in KEYS order:
--   allowed (1/0), remaining, reset (ns), retry_after (ns, 0 when allowed), delay (ns)
-- packed as little-endian doubles in one bulk string (all integers below 2^53, so exact): one
-- reply element instead of 5 per check, cheaper to produce here and to parse in the gateway.

local algorithms = {
  fw = fixed_window,
  swl = sliding_window_log,
  swc = sliding_window_counter,
  tb = token_bucket,
  lbp = leaky_bucket_police,
  lbs = leaky_bucket_shape,
  cc = concurrency,
}

local now
if ARGV[3] ~= nil and ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
  ttl_pad_ms = 3600000
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local lease = ARGV[1]
local lease_ttl = tonumber(ARGV[2])
local out = {}
local charges = {}
local admitted = true
for i, key in ipairs(KEYS) do
  local b = 3 + 7 * (i - 1)
  local decide = algorithms[ARGV[b + 1]]
  if decide == nil then
    return redis.error_reply('floodgate: unknown algorithm ' .. tostring(ARGV[b + 1]))
  end
  local p = {
    cost = tonumber(ARGV[b + 2]),
    limit = tonumber(ARGV[b + 3]),
    window = tonumber(ARGV[b + 4]),
    burst = tonumber(ARGV[b + 5]),
    interval = tonumber(ARGV[b + 6]),
    cap = tonumber(ARGV[b + 7]),
    lease = lease,
    lease_ttl = lease_ttl,
  }
  local allowed, remaining, reset, retry, delay, charge = decide(key, now, p)
  if allowed then
    out[#out + 1] = 1
    charges[#charges + 1] = charge
  else
    out[#out + 1] = 0
    admitted = false
  end
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
  out[#out + 1] = delay
end

if admitted then
  for _, charge in ipairs(charges) do
    charge()
  end
end
return struct.pack('<' .. string.rep('d', #out), unpack(out))
