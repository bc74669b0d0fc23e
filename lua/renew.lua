-- floodgate: renews the concurrency slots a running request holds (see concurrency.lua), so
-- that a request longer than the slot TTL (an export, a stream) keeps counting while it runs.
-- KEYS[i]     a concurrency key the request holds slots on
-- ARGV[1]     the request's slot id (16 hex digits)
-- ARGV[2]     the slot TTL, us
-- ARGV[2 + i] how many slots it holds on KEYS[i] (the rule's cost)
-- Only members that still exist are renewed (ZADD XX): a slot that already expired (or was
-- released) is not taken again, so renewing can never admit past the limit. Returns the
-- number of slots renewed.
-- ARGV[#ARGV] the call's tag (8 bytes the gateway drew), which the reply starts with: the
--               reply is {tag, count}, so that a reply is taken only by the call it answers
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[2])
local expires = string.format('%.0f', now + ttl)
local renewed = 0
for i, key in ipairs(KEYS) do
  local cost = tonumber(ARGV[2 + i]) or 0
  for n = 1, cost do
    local changed = redis.pcall('ZADD', key, 'XX', 'CH', expires, 'c' .. ARGV[1] .. ':' .. n)
    if type(changed) == 'number' then
      renewed = renewed + changed
    end
  end
  if redis.call('PTTL', key) < math.ceil(ttl / 1000) then
    redis.pcall('PEXPIRE', key, math.ceil(ttl / 1000))
  end
end
return {ARGV[#ARGV], renewed}
