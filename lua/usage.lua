-- floodgate: the usage API on one counter (GET /usage, POST /usage/reset, POST /usage/grant).
-- Composed after common.lua, wide.lua, gcra.lua, the algorithm files and algorithms.lua, like
-- decide.lua (see src/limiter/redis/script.rs), so that a counter is read by the very function
-- that decides.
--
-- KEYS[1]  the counter's state key (as decide.lua's)
-- ARGV[1]  'read', 'reset' or 'grant'
-- ARGV[2]  grant: the units granted for the current window
-- ARGV[3]  the check, packed as decide.lua's ARGV[4 + i] (81 bytes, or 113 with a calendar
--          rule's periods)
-- ARGV[4]  the change's idempotency key ('' for none)
-- ARGV[5]  the change's deadline (us since the epoch, the gateway's clock; 0 for none)
-- ARGV[6]  how long an idempotency key's answer is remembered, ms
-- ARGV[7]  the channel a reset is published on ('' for none)
--
-- A read decides a request of cost 0 without charging it. A reset deletes the state (the
-- counter starts over) and starts a new epoch: <key>:e holds the instant it started, and
-- true_up.lua and lease_return.lua drop what was charged before it (see same_epoch in
-- common.lua). A reset is published on ARGV[7] as '<key> <epoch start, us>', so that every
-- instance forgets the quota lease permits it holds of the old epoch (they would otherwise be
-- spent on top of the new counter). A grant lowers the current window's count of a fixed
-- window (or calendar period) by the amount, below zero if need be; it expires with the window.
-- A reset or grant that arrives past its deadline is not applied (the gateway has answered
-- that the store timed out). One made with an idempotency key is remembered in
-- <key>:i:<idempotency key> (same hash tag): a retry with that key answers the first
-- change's numbers and changes nothing.
-- Returns a status byte (0 applied now or a read, 1 a repeat of the change made under the
-- key, 2 the key was used for another change, 3 past the deadline: not applied), then the
-- remaining and reset (wide: us, ns) before and after, as six little-endian doubles;
-- remaining is below zero never, above the limit after a grant.

local now = redis_now()
local key = KEYS[1]
local op = ARGV[1]
local code, p = unpack_check(ARGV[3], '0000000000000000', 0)
if code == nil then
  return redis.error_reply('floodgate: the check is not 81 or 113 packed bytes')
end
local decide = algorithms[code]
if decide == nil then
  return redis.error_reply('floodgate: unknown algorithm ' .. code)
end
-- A read is a request of cost 0, whatever the check says.
p.cost = 0

local function look()
  local _, remaining, reset_u, reset_n = decide(key, now, p)
  return remaining, reset_u, reset_n
end

local idem = ARGV[4] or ''
local remembered = nil
local fingerprint = struct.pack('<Bd', op == 'grant' and 2 or 1, tonumber(ARGV[2]) or 0)
if op ~= 'read' and idem ~= '' then
  remembered = key .. ':i:' .. idem
  local seen = redis.call('GET', remembered)
  if seen and #seen == 9 + 48 then
    local status = 1
    if string.sub(seen, 1, 9) ~= fingerprint then
      status = 2
    end
    return struct.pack('<B', status) .. string.sub(seen, 10)
  end
end
local deadline = tonumber(ARGV[5] or '') or 0
if op ~= 'read' and deadline > 0 and now > deadline then
  return struct.pack('<Bdddddd', 3, 0, 0, 0, 0, 0, 0)
end

local r1, u1, n1 = look()
if op == 'reset' then
  -- A sliding log's debt (common.lua) is part of the counter.
  redis.call('DEL', key, key .. ':d')
  -- The new epoch's start, kept while a reservation or lease of the old one may still
  -- settle: two windows (the sliding counter's charge counts that long) and an hour more.
  redis.call('SET', key .. ':e', fmt(now), 'PX', ttl_ms(2 * p.window, 0) + 3600000)
  local channel = ARGV[7] or ''
  if channel ~= '' then
    redis.call('PUBLISH', channel, key .. ' ' .. fmt(now))
  end
elseif op == 'grant' then
  if code ~= 1 then
    return redis.error_reply('floodgate: grants apply to fixed windows only')
  end
  local _, window_end = fw_window(now, p)
  local stored_end, count = load_fields(key, TAG_FW, 2)
  if stored_end ~= window_end then
    count = 0
  end
  save_fields(key, TAG_FW, window_end - now, 0, window_end, count - tonumber(ARGV[2]))
elseif op ~= 'read' then
  return redis.error_reply('floodgate: unknown usage operation')
end
local r2, u2, n2 = look()
local numbers = struct.pack('<dddddd', r1, u1, n1, r2, u2, n2)
if remembered then
  redis.call('SET', remembered, fingerprint .. numbers, 'PX', tonumber(ARGV[6]) or 86400000)
end
return struct.pack('<B', 0) .. numbers
