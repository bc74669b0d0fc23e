-- floodgate: exact arithmetic past 2^53 (concatenated after common.lua; see its "Units").
--
-- A WIDE number is a nanosecond duration as two exact numbers: u whole microseconds and
-- n nanoseconds, 0 <= n < 1000, worth u * 1000 + n. u stays below 2^53 (285 years), so a wide
-- number holds every duration a valid rule computes, to the nanosecond. Functions take and
-- return the halves as separate values (u, n), never tables: no allocation per decision.
-- Lua keeps only the first value of a call that is not the last argument, so a wide result is
-- always passed last or stored in two locals first.

-- 2^53: the first integer a double may not hold exactly.
local TWO53 = 9007199254740992

-- floor(a * b / c) and a * b mod c for integers a, b >= 0 and 0 < c <= 2^51 whose quotient is
-- below 2^53, exactly, without forming a * b when it passes 2^53: b is taken digit by digit
-- (in base `base`, the largest power of two with base * c <= 2^52), so that every partial sum
-- stays below 2^53.
local function mul_div(a, b, c)
  local p = a * b
  if p < TWO53 then
    -- The product is exact (a rounded product at or past 2^53 never comes out below it).
    return floor_div(p, c)
  end
  local qa, ra = floor_div(a, c)
  local _, e = math.frexp(TWO53 / 2 / c)
  local base = math.ldexp(1, e - 1)
  if base * c > TWO53 / 2 then
    base = base / 2
  end
  if base < 2 then
    -- c past 2^51: no valid rule gets here; inexact then, but never a loop without end.
    base = 2
  end
  local digits = {}
  local rest = b
  while rest > 0 do
    local d
    rest, d = floor_div(rest, base)
    digits[#digits + 1] = d
  end
  -- Invariant: ra * (the digits so far) = q * c + r, 0 <= r < c.
  local q, r = 0, 0
  for i = #digits, 1, -1 do
    local dq
    dq, r = floor_div(r * base + ra * digits[i], c)
    q = q * base + dq
  end
  return qa * b + q, r
end

-- (u, n) with n brought into 0..999 (n may be any integer below 2^53 in magnitude).
local function w_norm(u, n)
  local carry, rest = floor_div(n, 1000)
  return u + carry, rest
end

local function w_add(au, an, bu, bn)
  return w_norm(au + bu, an + bn)
end

-- a - b; negative when b > a (then u < 0).
local function w_sub(au, an, bu, bn)
  return w_norm(au - bu, an - bn)
end

local function w_lt(au, an, bu, bn)
  return au < bu or (au == bu and an < bn)
end

local function w_le(au, an, bu, bn)
  return au < bu or (au == bu and an <= bn)
end

-- Whether a > 0.
local function w_pos(u, n)
  return u > 0 or (u == 0 and n > 0)
end

-- k * (u, n) for an integer k >= 0 (exact while the result is below 2^53 us):
-- k * (1000u + n) = 1000 (k u + k1 n) + k0 n, with k = 1000 k1 + k0.
local function w_mul(k, u, n)
  local k1, k0 = floor_div(k, 1000)
  return w_norm(k * u + k1 * n, k0 * n)
end

-- floor(a / b) for wide a >= 0 and b > 0 whose quotient is below 2^53: the quotient of the
-- doubles is off by a few at most, and is put right by exact products.
local function w_div(au, an, bu, bn)
  local q = math.floor((au * 1000 + an) / (bu * 1000 + bn))
  if q < 0 then
    q = 0
  end
  while q > 0 and w_lt(au, an, w_mul(q, bu, bn)) do
    q = q - 1
  end
  while true do
    local mu, mn = w_mul(q + 1, bu, bn)
    if w_lt(au, an, mu, mn) then
      return q
    end
    q = q + 1
  end
end

-- ceil(a / b), same domain as w_div.
local function w_ceil_div(au, an, bu, bn)
  local q = w_div(au, an, bu, bn)
  local mu, mn = w_mul(q, bu, bn)
  if w_lt(mu, mn, au, an) then
    q = q + 1
  end
  return q
end
