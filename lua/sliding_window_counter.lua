-- Sliding window counter: mirrors algorithm::sliding_window_counter. The previous aligned
-- window's count weighted by its overlap with the last window, plus the current count:
--   previous * (window - elapsed) / window + current + cost <= limit
-- compared exactly in integers (all terms in units of 1/window of a request, in us; the
-- reference's nanosecond terms are these times 1000, so every comparison agrees). Exact while
-- limit * window_us < 2^53 (e.g. a limit of 1,000,000 per hour).
-- State: TAG_SWC, <current window start + 2 windows, us>, <previous>, <current>, expiring
-- when both counts stop mattering.
-- p: cost, limit, window (us).
local function sliding_window_counter(key, now, p)
  local w, l, c = p.window, p.limit, p.cost
  local _, elapsed = floor_div(now, w)
  local start = now - elapsed
  local prev, cur = 0, 0
  local stored_expires, stored_prev, stored_cur = load_fields(key, TAG_SWC, 3)
  if stored_expires then
    local stored_start = stored_expires - 2 * w
    if stored_start == start then
      prev, cur = stored_prev, stored_cur
    elseif stored_start + w == start then
      prev, cur = stored_cur, 0
    end
  end
  local left = w - elapsed
  local weighted = prev * left
  local capacity = l * w
  local used = weighted + (cur + c) * w
  if used <= capacity then
    local remaining = floor_div(capacity - used, w)
    local reset = 0
    if cur + c > 0 then
      reset = (left + w) * 1000
    elseif prev > 0 then
      reset = left * 1000
    end
    return true, remaining, reset, 0, 0, function()
      local expires = start + 2 * w
      save_fields(key, TAG_SWC, (expires - now) * 1000, expires, prev, cur + c)
    end
  end
  local reset = left * 1000
  if cur > 0 then
    reset = (left + w) * 1000
  end
  if c > l then
    return false, 0, reset, w * 1000, 0, nil
  end
  -- Still in this window: need prev * (left - r) + (cur + c) * w <= l * w.
  if cur + c <= l and prev > 0 then
    local excess = weighted - (l - cur - c) * w
    local r = mul_ceil_div(excess, 1000, prev)
    if r < left * 1000 then
      return false, 0, reset, r, 0, nil
    end
  end
  -- In the next window, x into it: need cur * (w - x) + c * w <= l * w.
  local x = 0
  if cur + c > l then
    x = mul_ceil_div(w * (cur + c - l), 1000, cur)
  end
  return false, 0, reset, left * 1000 + x, 0, nil
end
