-- Sliding window counter: mirrors algorithm::sliding_window_counter. The previous aligned
-- window's count weighted by its overlap with the last window, plus the current count:
--   previous * (window - elapsed) / window + current + cost <= limit
-- compared exactly in integers. The reference compares previous * left + (current + cost) *
-- window with limit * window (in units of 1/window of a request); those products pass 2^53
-- with large limits and long windows (a million a day), so this compares the same thing
-- without forming them: admitted iff ceil(previous * left / window) + current + cost <= limit
-- (the previous window's units still counting, rounded up; see mul_div in wide.lua).
-- State: TAG_SWC, <current window start + 2 windows, us>, <previous>, <current>, expiring
-- when both counts stop mattering.
-- p: cost, limit, window (us).
-- Returns allowed, remaining, reset, retry, delay (each wide: u, n), charge.
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
  -- Room left once this request is counted, before the previous window's weight.
  local room = l - cur - c
  local weight_q, weight_r = mul_div(prev, left, w)
  local weight = weight_q
  if weight_r > 0 then
    weight = weight + 1
  end
  if room >= 0 and weight <= room then
    local reset = 0
    if cur + c > 0 then
      reset = left + w
    elseif prev > 0 then
      reset = left
    end
    return true, room - weight, reset, 0, 0, 0, 0, 0, function()
      local expires = start + 2 * w
      save_fields(key, TAG_SWC, expires - now, 0, expires, prev, cur + c)
    end
  end
  local reset = left
  if cur > 0 then
    reset = left + w
  end
  if c > l then
    return false, 0, reset, 0, w, 0, 0, 0, nil
  end
  -- Still in this window, r ns from now: need prev * (left - r) <= room * w, i.e.
  -- r = 1000 left - floor(1000 room w / prev) (ns), if that is before the window ends.
  if room >= 0 and prev > 0 then
    local q1, r1 = mul_div(room, w, prev)
    local q2 = mul_div(1000, r1, prev)
    if q1 > 0 or q2 > 0 then
      local retry_u, retry_n = w_sub(left, 0, q1, q2)
      return false, 0, reset, 0, retry_u, retry_n, 0, 0, nil
    end
  end
  -- In the next window, x ns into it: need cur * (1000 w - x) + 1000 c w <= 1000 l w, i.e.
  -- x = ceil(1000 w (cur + c - l) / cur).
  local retry_u, retry_n = left, 0
  if room < 0 then
    local q1, r1 = mul_div(w, -room, cur)
    local q2, r2 = mul_div(1000, r1, cur)
    if r2 > 0 then
      q2 = q2 + 1
    end
    retry_u, retry_n = w_add(left, 0, q1, q2)
  end
  return false, 0, reset, 0, retry_u, retry_n, 0, 0, nil
end
