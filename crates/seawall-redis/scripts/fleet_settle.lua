-- fleet_settle.lua: ends a call's hold and settles its token reservation, once.
--
-- Everything a call does to the buckets after its admission goes through its hold, so it
-- happens at most once: a settlement sent twice, or a cancellation of a call whose
-- admission never ran, finds no hold and changes nothing.
--
-- KEYS[1]  the key's buckets (hash)      KEYS[2]  the key's holds (zset)
-- ARGV[1]  now, ms on the caller's clock
-- ARGV[2]  the call's hold id
-- ARGV[3]  requests a minute (-1: none)  ARGV[4]  the request burst
-- ARGV[5]  tokens a minute (-1: none)    ARGV[6]  the token burst
-- ARGV[7]  the tokens taken at admission
-- ARGV[8]  the tokens the call used
-- ARGV[9]  'settle' (the call went: unused tokens go back, an overrun becomes debt) or
--          'cancel' (the call never went: its request and every token go back)
--
-- Returns 1 when the hold was there (and is now settled), 0 when it was not.
local now = tonumber(ARGV[1])
if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then
  return 0
end
local rpm, rburst = tonumber(ARGV[3]), tonumber(ARGV[4])
local tpm, tburst = tonumber(ARGV[5]), tonumber(ARGV[6])
local reserved, used = tonumber(ARGV[7]), tonumber(ARGV[8])
local cancel = ARGV[9] == 'cancel'
if cancel then
  used = 0
  if rpm >= 0 then
    local r, at = bucket_level(KEYS[1], 'r', now, rpm, rburst)
    bucket_store(KEYS[1], 'r', math.min(r + 1, rburst), at, rpm, rburst)
  end
end
if tpm >= 0 and used ~= reserved then
  local t, at = bucket_level(KEYS[1], 't', now, tpm, tburst)
  if used > reserved then
    t = t - (used - reserved)
  else
    -- Given back, never above the bucket's size.
    t = math.min(t + (reserved - used), tburst)
  end
  bucket_store(KEYS[1], 't', t, at, tpm, tburst)
end
return 1
