-- fleet_bucket.lua: the token bucket of seawall-gate (`seawall_gate::Bucket`) kept in Redis.
-- Not run on its own: the layer prepends it to fleet_acquire.lua and fleet_settle.lua, so the
-- refill arithmetic is written once.
--
-- A bucket is two fields of the key's hash: `<f>` (the level, which may be negative: debt)
-- and `<f>_at` (when it was last refilled, in ms on the callers' clock). A missing bucket is
-- full: the hash expires only once every bucket in it has refilled, so forgetting it loses
-- nothing. Callers' clocks that disagree a little never refill a bucket twice: time only
-- moves forward (`now > at`).

-- The level of bucket `f` at `now`, refilled at `per_minute` units a minute up to `burst`,
-- and the time it is now refilled to.
local function bucket_level(key, f, now, per_minute, burst)
  local v = redis.call('HMGET', key, f, f .. '_at')
  local level = tonumber(v[1]) or burst
  local at = tonumber(v[2]) or now
  if now > at then
    level = level + (now - at) * per_minute / 60000
    at = now
  end
  -- Also clamps a level to a burst made smaller since it was stored.
  return math.min(level, burst), at
end

-- Stores bucket `f` and keeps the hash at least until it has refilled (TTLs are garbage
-- collection only: the decisions use the levels, never the server's clock).
local function bucket_store(key, f, level, at, per_minute, burst)
  redis.call('HSET', key, f, string.format('%.17g', level), f .. '_at', string.format('%d', at))
  local to_full = 0
  if per_minute > 0 and level < burst then
    to_full = math.ceil((burst - level) * 60000 / per_minute)
  end
  local keep = to_full + 1000
  local left = redis.call('PTTL', key)
  if left < keep then
    redis.call('PEXPIRE', key, string.format('%d', keep))
  end
end

-- How long until `need` units are in the bucket: 0 now, -1 never (a zero rate).
local function bucket_wait(level, need, per_minute)
  if per_minute == 0 then
    return -1
  end
  -- The gate's slack for float rounding.
  if level + 1e-6 >= need then
    return 0
  end
  return math.ceil((need - level) * 60000 / per_minute)
end

-- Keeps a key alive at least `ms` more (never shortens what another caller asked for).
local function keep_for(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, string.format('%d', ms))
  end
end

