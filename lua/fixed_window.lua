-- Fixed window: mirrors algorithm::fixed_window. One counter per window aligned on multiples
-- of the window since the Unix epoch.
-- State: TAG_FW, <window end, us>, <count> (packed, see common.lua), expiring at the window's end.
-- p: cost, limit, window (us), periods (calendar rules only).
-- Calendar rules (p.periods: previous start, current start, next start, next end, us, as the
-- gateway computed them around its own time): the window is the one of those periods that
-- holds Redis' now, so every gateway counts in the same period whatever its clock says. A
-- Redis clock more than a period off the gateway's takes the nearest of the three.
-- Returns allowed, remaining, reset, retry, delay (each wide: u, n; see wide.lua), charge.
local function fw_window(now, p)
  local b = p.periods
  if b == nil then
    local _, into = floor_div(now, p.window)
    return now - into, now - into + p.window
  end
  if now < b[2] then
    return b[1], b[2]
  end
  if now < b[3] then
    return b[2], b[3]
  end
  return b[3], b[4]
end

local function fixed_window(key, now, p)
  local window_start, window_end = fw_window(now, p)
  local w = window_end - window_start
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
