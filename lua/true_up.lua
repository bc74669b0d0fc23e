-- floodgate: trues up the reservations of response-aware rules (count, cost_from), one
-- batched call per gateway and cluster slot (composed after common.lua, wide.lua and
-- gcra.lua; see src/limiter/true_up.rs, the reference, and src/limiter/redis/script.rs).
--
-- KEYS[i]           the state key the reservation was charged to
-- ARGV[i]           packed little-endian '<Bddddddd': algorithm code (as decide.lua: 1 fixed
--                   window, 2 sliding log, 3 sliding counter, 4 token bucket, 5 leaky bucket
--                   police), refund, extra, interval (wide: us, ns; the buckets), window (us),
--                   window end (us, the windows: the aligned window the reservation was
--                   charged in), charged at (us, Redis time of the call that charged it)
-- ARGV[#KEYS + i]   the holder id (16 hex digits) of the call that charged it: the sliding
--                   log's entries are named by it
--
-- A refund undoes the charge; an extra charge adds to it and is never refused (it may pass
-- the limit: the following requests wait until it drains). Both apply only to the window the
-- reservation was charged in, while it still counts: never to another, nor to the counter a
-- usage reset started after the charge (same_epoch, common.lua). Returns the number of
-- reservations trued up.
-- ARGV[#ARGV] the call's tag (8 bytes the gateway drew), which the reply starts with: the
--               reply is {tag, count}, so that a reply is taken only by the call it answers
local now = redis_now()
local applied = 0
local n_keys = #KEYS
for i, key in ipairs(KEYS) do
  local packed = ARGV[i]
  local holder = ARGV[n_keys + i]
  if packed ~= nil and #packed == 57 then
    local code, refund, extra, int_u, int_n, window, window_end, charged_at =
      struct.unpack('<Bddddddd', packed)
    if not same_epoch(key, charged_at) then
      -- Reset since: the charge is gone with the old counter.
      code = 0
    end
    if code == 1 then
      local count = fw_charged_count(key, window_end, now)
      if count then
        -- Never below zero, nor below a count a usage grant already took there.
        local next = math.max(math.min(count, 0), count - refund) + extra
        save_fields(key, TAG_FW, window_end - now, 0, window_end, next)
        applied = applied + 1
      end
    elseif code == 2 then
      -- Entries "l<holder>:1".."l<holder>:<cost>" (see sliding_window_log.lua). An extra
      -- charge is owed as the log's debt until the reservation's entries stop counting (their
      -- score), and is dropped when they already have.
      if holder ~= nil and extra > 0 then
        -- pcall: after a reload that changed the algorithm the key may hold another type.
        local score = redis.pcall('ZSCORE', key, 'l' .. holder .. ':1')
        if type(score) == 'string' and tonumber(score) > now then
          log_owe(key, now, extra, tonumber(score))
          applied = applied + 1
        end
      end
      if holder ~= nil and refund > 0 then
        -- In batches: unpack() of a very long list would overflow the Lua C stack.
        local removed = 0
        local j = 1
        while j <= refund do
          local members = {}
          local last = math.min(refund, j + 499)
          for m = j, last do
            members[#members + 1] = 'l' .. holder .. ':' .. m
          end
          removed = removed + redis.call('ZREM', key, unpack(members))
          j = last + 1
        end
        if removed > 0 then
          applied = applied + 1
        end
      end
    elseif code == 3 then
      local expires, prev, cur, moved = swc_charged(key, window_end, window, now)
      if expires and not moved then
        save_fields(key, TAG_SWC, expires - now, 0, expires, prev, math.max(0, cur - refund) + extra)
        applied = applied + 1
      elseif expires then
        -- The window moved on: the charge is now the previous window's count.
        save_fields(key, TAG_SWC, expires - now, 0, expires, math.max(0, prev - refund) + extra, cur)
        applied = applied + 1
      end
    elseif code == 4 or code == 5 then
      local tag, u, ns = gcra_charged_debt(key, code, now, int_u, int_n)
      if tag then
        -- Debt left at now (never below empty), minus the refund, plus the extra charge.
        if not w_pos(u, ns) then
          u, ns = 0, 0
        end
        if refund > 0 then
          if refund < w_ceil_div(u, ns, int_u, int_n) then
            local paid_u, paid_n = w_mul(refund, int_u, int_n)
            u, ns = w_sub(u, ns, paid_u, paid_n)
          else
            u, ns = 0, 0
          end
        end
        if extra > 0 then
          local more_u, more_n = w_mul(extra, int_u, int_n)
          u, ns = w_add(u, ns, more_u, more_n)
        end
        gcra_save(key, tag, now, u, ns, int_u, int_n)
        applied = applied + 1
      end
    end
  end
end
return {ARGV[#ARGV], applied}
