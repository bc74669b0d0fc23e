-- floodgate: gives back the unspent permits of quota leases, one batched call per gateway
-- (composed after common.lua, wide.lua and gcra.lua; see src/limiter/lease.rs and
-- src/limiter/redis/script.rs).
--
-- KEYS[i]  the state key a lease was taken from
-- ARGV[i]  packed little-endian '<Bdddddd': algorithm code (as decide.lua: 1 fixed window,
--          3 sliding counter, 4 token bucket, 5 leaky bucket police), permits to give back,
--          interval (wide: us, ns; the buckets), window (us), window end (us, the windows: the
--          aligned window the lease was charged to), charged at (us, Redis time of the
--          earliest call that charged the lease's permits)
--
-- A permit is given back by undoing its charge: the window's count goes down (only while the
-- lease's window is still the current one: a permit of an ended window is worth nothing), and
-- a bucket's debt shrinks by interval per permit (never below empty). Undoing the charge of a
-- permit that was never spent leaves the state exactly as if the lease had been smaller.
-- Permits charged before a usage reset of the key are not given back to the new counter
-- (same_epoch, common.lua). Returns the number of permits given back.
-- ARGV[#ARGV] the call's tag (8 bytes the gateway drew), which the reply starts with: the
--               reply is {tag, count}, so that a reply is taken only by the call it answers
local now = redis_now()
local returned = 0
for i, key in ipairs(KEYS) do
  local packed = ARGV[i]
  if packed ~= nil and #packed == 49 then
    local code, n, int_u, int_n, window, window_end, charged_at =
      struct.unpack('<Bdddddd', packed)
    if not same_epoch(key, charged_at) then
      -- Reset since: the permits were charged to the old counter, which is gone.
      code = 0
    end
    if code == 1 then
      local count = fw_charged_count(key, window_end, now)
      if count then
        -- A count a grant took below zero has nothing of the lease's left to give back.
        local back = math.max(0, math.min(n, count))
        save_fields(key, TAG_FW, window_end - now, 0, window_end, count - back)
        returned = returned + back
      end
    elseif code == 3 then
      -- Only while the lease's window is the current one: once it has moved on, an
      -- unspent permit is worth nothing, as in an ended fixed window.
      local expires, prev, cur, moved = swc_charged(key, window_end, window, now)
      if expires and not moved then
        local back = math.min(n, cur)
        save_fields(key, TAG_SWC, expires - now, 0, expires, prev, cur - back)
        returned = returned + back
      end
    elseif code == 4 or code == 5 then
      local tag, u, ns = gcra_charged_debt(key, code, now, int_u, int_n)
      if tag and w_pos(u, ns) then
        -- Each permit undoes one interval of debt, never below empty.
        local back = math.min(n, w_div(u, ns, int_u, int_n))
        local left_u, left_n = 0, 0
        if n < w_ceil_div(u, ns, int_u, int_n) then
          local paid_u, paid_n = w_mul(n, int_u, int_n)
          left_u, left_n = w_sub(u, ns, paid_u, paid_n)
        end
        gcra_save(key, tag, now, left_u, left_n, int_u, int_n)
        returned = returned + back
      end
    end
  end
end
return {ARGV[#ARGV], returned}
