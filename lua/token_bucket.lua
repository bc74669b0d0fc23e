-- Token bucket: mirrors algorithm::token_bucket (GCRA, state tagged TAG_TB, see gcra.lua).
-- Holds up to `burst` tokens refilled at limit per window: interval = ceil(window_ns / limit)
-- nanoseconds per token, computed by the Rust side exactly as the reference does.
local function token_bucket(key, now, p)
  return gcra_police(key, TAG_TB, now, p)
end
