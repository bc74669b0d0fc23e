-- Fixed window: mirrors algorithm::fixed_window. One counter per window aligned on multiples
-- of the window since the Unix epoch.
-- State: TAG_FW, <window end, us>, <count> (packed, see common.lua), expiring at the window's end.
-- p: cost, limit, window (us).
-- Returns allowed, remaining, reset, retry, delay (each wide: u, n; see wide.lua), charge.
local function fixed_window(key, now, p)
  local w = p.window
  local _, into = floor_div(now, w)
  local window_end = now - into + w
  local count = 0
  local stored_end, stored_count = load_fields(key, TAG_FW, 2)
  if stored_end == window_end then
    count = stored_count
  end
  local reset = window_end - now
  local charged = count + p.cost
  if charged <= p.limit then
    return true, p.limit - charged, reset, 0, 0, 0, 0, 0, function()
      save_fields(key, TAG_FW, reset, 0, window_end, charged)
    end
  end
  if p.cost > p.limit then
    -- Never admitted: there is no true answer, the reference says one window.
    return false, 0, reset, 0, w, 0, 0, 0, nil
  end
  return false, 0, reset, 0, reset, 0, 0, 0, nil
end
