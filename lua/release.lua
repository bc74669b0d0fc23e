-- floodgate: gives back the concurrency slots one request took (see concurrency.lua).
-- KEYS[i]     a concurrency key the request was admitted on
-- ARGV[1]     the request's lease id (16 hex digits)
-- ARGV[1 + i] how many slots it took on KEYS[i] (the rule's cost)
-- Removes exactly this lease's members, so it can never free another request's slot, and is
-- harmless when the lease already expired or was never charged. An emptied set is deleted by
-- Redis itself. Returns the number of slots freed.
-- ARGV[#ARGV] the call's tag (8 bytes the gateway drew), which the reply starts with: the
--               reply is {tag, count}, so that a reply is taken only by the call it answers
local freed = 0
for i, key in ipairs(KEYS) do
  local cost = tonumber(ARGV[1 + i]) or 0
  local j = 1
  while j <= cost do
    local members = {}
    local last = math.min(cost, j + 499)
    for n = j, last do
      members[#members + 1] = 'c' .. ARGV[1] .. ':' .. n
    end
    -- pcall: a key that now holds another algorithm's state (a reload) is left alone.
    local removed = redis.pcall('ZREM', key, unpack(members))
    if type(removed) == 'number' then
      freed = freed + removed
    end
    j = last + 1
  end
end
return {ARGV[#ARGV], freed}
