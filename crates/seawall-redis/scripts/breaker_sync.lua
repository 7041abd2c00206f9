-- One replica's breaker sync: push its evidence and events, pull the fleet's open keys.
--
-- Run atomically by the server, so the evaluation of a key's shared window, the decision to
-- open it fleet-wide and the claim of its probe lease can never interleave with another
-- replica's sync: two replicas cannot both open a key with different deadlines, nor both take
-- the probe lease.
--
-- KEYS[1]  the fleet's open keys: a sorted set, member = breaker key, score = open until (ms)
-- ARGV[1]  the prefix of the per-key keys ("<prefix>:breaker:"): <base>win:<key> is the key's
--          shared window (a hash of bucket fields "<n>:c", "<n>:f", "<n>:s"), <base>lease:<key>
--          its probe lease ("<expires ms>:<replica>")
-- ARGV[2]  this replica's name
-- ARGV[3]  now, in ms (the replicas' clock, not the server's: it can be injected in tests)
-- ARGV[4]  the shared window, ms          ARGV[5]  one bucket of it, ms
-- ARGV[6]  minimum calls                  ARGV[7]  failure rate ("" = never)
-- ARGV[8]  slow-call rate ("" = off)      ARGV[9]  how long a fleet trip opens a key, ms
-- ARGV[10] how long a probe lease lasts, ms
-- ARGV[11] how long after its open period an unprobed key is forgotten, ms
-- ARGV[12] n events, then n times: kind ("hint" | "closed" | "reopen"), key, ms
-- then     m reports, then m times: key, calls, failures, slow calls, wants probe ("1"/"0")
--
-- Returns, for every key the fleet holds open: key, ms left of its open period (<= 0: over,
-- waiting for a probe), and its lease (0: none, 1: this replica's, 2: another's).

local open = KEYS[1]
local base = ARGV[1]
local me = ARGV[2]
local now = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local bucket = tonumber(ARGV[5])
local min_calls = tonumber(ARGV[6])
local failure_rate = tonumber(ARGV[7])
local slow_rate = tonumber(ARGV[8])
local open_ms = tonumber(ARGV[9])
local lease_ms = tonumber(ARGV[10])
local stale_ms = tonumber(ARGV[11])

-- The live holder of a key's probe lease, or nil. The expiry is in the value, on the
-- replicas' clock; the key's own PX only collects garbage.
local function holder(key)
  local v = redis.call('GET', base .. 'lease:' .. key)
  if not v then return nil end
  local sep = string.find(v, ':', 1, true)
  if not sep or tonumber(string.sub(v, 1, sep - 1)) <= now then return nil end
  return string.sub(v, sep + 1)
end

-- Holds a key open until `untl`, never shortening a longer open period.
local function extend(key, untl)
  local cur = tonumber(redis.call('ZSCORE', open, key))
  if not cur or untl > cur then redis.call('ZADD', open, untl, key) end
end

-- Unprobed for too long (no replica had a call for the key): forget it.
redis.call('ZREMRANGEBYSCORE', open, '-inf', '(' .. (now - stale_ms))

local i = 12
local n = tonumber(ARGV[i])
i = i + 1
for _ = 1, n do
  local kind, key, ms = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  i = i + 3
  if kind == 'hint' then
    -- An upstream said when it takes calls again: published as is, no evidence needed.
    extend(key, now + ms)
  elseif holder(key) == me then
    -- A probe's outcome counts only from the replica holding the lease: a late outcome
    -- (its lease expired and maybe went to another replica) is dropped.
    redis.call('DEL', base .. 'lease:' .. key)
    if kind == 'closed' then
      redis.call('ZREM', open, key)
      redis.call('DEL', base .. 'win:' .. key)
    else
      redis.call('ZADD', open, now + ms, key)
    end
  end
end

local m = tonumber(ARGV[i])
i = i + 1
local idx = math.floor(now / bucket)
local oldest = idx - math.ceil(window / bucket) + 1
for _ = 1, m do
  local key, c, f, s, wants = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
    tonumber(ARGV[i + 3]), ARGV[i + 4]
  i = i + 5
  if c > 0 then
    local win = base .. 'win:' .. key
    redis.call('HINCRBY', win, idx .. ':c', c)
    if f > 0 then redis.call('HINCRBY', win, idx .. ':f', f) end
    if s > 0 then redis.call('HINCRBY', win, idx .. ':s', s) end
    redis.call('PEXPIRE', win, window + bucket)
    local calls, failures, slow = 0, 0, 0
    local fields = redis.call('HGETALL', win)
    for j = 1, #fields, 2 do
      local name = fields[j]
      local b = tonumber(string.sub(name, 1, -3))
      if b < oldest then
        redis.call('HDEL', win, name)
      else
        local v = tonumber(fields[j + 1])
        local what = string.sub(name, -1)
        if what == 'c' then calls = calls + v
        elseif what == 'f' then failures = failures + v
        else slow = slow + v end
      end
    end
    -- The fleet's rule: the *fleet's* window trips the key, with its minimum calls, never
    -- one replica's view of it.
    if calls >= min_calls and not redis.call('ZSCORE', open, key) then
      if (failure_rate and failures >= failure_rate * calls)
        or (slow_rate and slow >= slow_rate * calls) then
        redis.call('ZADD', open, now + open_ms, key)
        redis.call('DEL', win)
      end
    end
  end
  if wants == '1' then
    local untl = tonumber(redis.call('ZSCORE', open, key))
    if untl and untl <= now and not holder(key) then
      redis.call('SET', base .. 'lease:' .. key, (now + lease_ms) .. ':' .. me,
        'PX', 2 * lease_ms + stale_ms)
    end
  end
end

local out = {}
local entries = redis.call('ZRANGE', open, 0, -1, 'WITHSCORES')
for j = 1, #entries, 2 do
  local key = entries[j]
  local h = holder(key)
  local lease = 0
  if h == me then lease = 1 elseif h then lease = 2 end
  -- As strings: integer replies would be fine too, but one type keeps the reply flat.
  out[#out + 1] = key
  out[#out + 1] = string.format('%d', tonumber(entries[j + 1]) - now)
  out[#out + 1] = tostring(lease)
end
return out
