-- fleet_acquire.lua: admits one call under a key's fleet-wide limits, or says how long to
-- wait. The upstream's pause, the request and token buckets and the permits are checked and
-- taken in one step: a script runs alone on the server, so two replicas can never both take
-- the last unit, and a call is either charged everywhere or nowhere.
--
-- KEYS[1]  the key's buckets (hash; see fleet_bucket.lua: `r` requests, `t` tokens)
-- KEYS[2]  the key's holds (zset: hold id -> lease expiry, ms)
-- KEYS[3]  the key's pause (string: paused until, ms)
-- ARGV[1]  now, ms on the caller's clock
-- ARGV[2]  the call's hold id
-- ARGV[3]  the lease, ms
-- ARGV[4]  requests a minute (-1: no request limit)     ARGV[5]  the request burst
-- ARGV[6]  tokens a minute (-1: no token limit)         ARGV[7]  the token burst
-- ARGV[8]  the call's estimated tokens
-- ARGV[9]  the key's permits (-1: no permit limit)
-- ARGV[10] what to answer while every permit is held (ms): a permit comes back when a
--          call ends, which no one can predict, so the caller polls
--
-- Returns {1, 0, 'admitted'}; {1, 0, 'held'} when this id holds an admission already (a
-- repeated call after a timeout: nothing is taken twice); {0, wait_ms, why} with `why` one
-- of 'paused', 'requests', 'tokens', 'permits'; or {-1, 0, 'zero'} when a limit is zero.
local now = tonumber(ARGV[1])
local id = ARGV[2]
if redis.call('ZSCORE', KEYS[2], id) then
  return {1, 0, 'held'}
end

local paused = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
if paused > now then
  return {0, paused - now, 'paused'}
end

local rpm, rburst = tonumber(ARGV[4]), tonumber(ARGV[5])
local tpm, tburst = tonumber(ARGV[6]), tonumber(ARGV[7])
local cost = tonumber(ARGV[8])
local wait, why = 0, nil
local r, r_at, t, t_at
if rpm >= 0 then
  r, r_at = bucket_level(KEYS[1], 'r', now, rpm, rburst)
  local w = bucket_wait(r, 1, rpm)
  if w < 0 then
    return {-1, 0, 'zero'}
  end
  if w > wait then
    wait, why = w, 'requests'
  end
end
if tpm >= 0 then
  t, t_at = bucket_level(KEYS[1], 't', now, tpm, tburst)
  -- A cost above the bucket's size goes when the bucket is full and leaves it in debt.
  local w = bucket_wait(t, math.min(cost, tburst), tpm)
  if w < 0 then
    return {-1, 0, 'zero'}
  end
  if w > wait then
    wait, why = w, 'tokens'
  end
end
if wait > 0 then
  return {0, wait, why}
end

-- Holds whose lease ran out belong to replicas that died (a live one renews its leases):
-- their permits are free again.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local permits = tonumber(ARGV[9])
if permits >= 0 and redis.call('ZCARD', KEYS[2]) >= permits then
  if permits == 0 then
    return {-1, 0, 'zero'}
  end
  return {0, tonumber(ARGV[10]), 'permits'}
end

if rpm >= 0 then
  bucket_store(KEYS[1], 'r', r - 1, r_at, rpm, rburst)
end
if tpm >= 0 then
  bucket_store(KEYS[1], 't', t - cost, t_at, tpm, tburst)
end
local lease = tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], string.format('%d', now + lease), id)
keep_for(KEYS[2], lease + 1000)
return {1, 0, 'admitted'}
