-- Leaky bucket: mirrors algorithm::leaky_bucket (GCRA, state tagged TAG_LB, see gcra.lua). Police
-- and shape share the state, so a reload that changes the mode keeps the bucket's level.
local function leaky_bucket_police(key, now, p)
  return gcra_police(key, TAG_LB, now, p)
end

local function leaky_bucket_shape(key, now, p)
  return gcra_shape(key, TAG_LB, now, p)
end
