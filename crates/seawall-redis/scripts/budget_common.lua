-- Shared by the budget scripts (prepended to each when it is loaded).
--
-- A counter is two keys: a hash C (settled, reserved, pend, head, soft, s<slot>) and a
-- sorted set L of the leases that make up `reserved` (member "<amount>:<id>", score the
-- lease's end in milliseconds on the callers' clocks). Money is counted in whole
-- nano-dollars with HINCRBY (exact 64-bit integers on the server); only comparisons go
-- through Lua numbers, which are exact up to 2^53 nano-dollars (about $9 million).

local RING = 61

local function num(v)
  if v then return tonumber(v) end
  return 0
end

-- Drops the leases that ended at or before `now` and gives their amounts back: a
-- reservation whose replica died (or never settled) stops counting here.
local function sweep(c, l, now)
  local gone = redis.call('ZRANGEBYSCORE', l, '-inf', now)
  if #gone == 0 then return end
  local freed = 0
  for _, m in ipairs(gone) do
    freed = freed + tonumber(string.match(m, '^(%d+):'))
  end
  redis.call('ZREMRANGEBYSCORE', l, '-inf', now)
  local left = num(redis.call('HGET', c, 'reserved')) - freed
  if left < 0 then left = 0 end
  redis.call('HSET', c, 'reserved', string.format('%d', left))
end

-- Brings the counter's window up to `now`, as MemoryStore does: a calendar window starts
-- empty once `now` reaches the end of the period its spend belongs to (`arg` is the end of
-- the period holding `now`, in ms); a rolling window drops the sub-windows that left it
-- (`arg` is the index of the sub-window holding `now`; it never moves back, so a replica
-- whose clock is behind adds to the newest sub-window). A rolling window re-arms its soft
-- threshold once its spend is below it.
local function bring(c, l, now, kind, arg, soft)
  sweep(c, l, now)
  if kind == 'c' then
    if now >= num(redis.call('HGET', c, 'pend')) then
      redis.call('HSET', c, 'pend', arg, 'settled', '0', 'soft', '0')
    end
  elseif kind == 'r' then
    local b = tonumber(arg)
    local head = redis.call('HGET', c, 'head')
    if not head then
      redis.call('HSET', c, 'head', arg)
    else
      head = tonumber(head)
      if b > head then
        local steps = math.min(b - head, RING)
        for i = 1, steps do
          local slot = 's' .. string.format('%d', (head + i) % RING)
          local v = redis.call('HGET', c, slot)
          if v then
            redis.call('HINCRBY', c, 'settled', '-' .. v)
            redis.call('HDEL', c, slot)
          end
        end
        redis.call('HSET', c, 'head', arg)
      end
    end
    if soft ~= '' and num(redis.call('HGET', c, 'settled')) < tonumber(soft) then
      redis.call('HSET', c, 'soft', '0')
    end
  end
end

-- Keeps an idle windowed counter from living forever (`ttl` ms of real time, 0 for never).
local function keep(c, l, ttl)
  if ttl ~= '0' then
    redis.call('PEXPIRE', c, ttl)
    redis.call('PEXPIRE', l, ttl)
  end
end

local function field(c, f)
  return redis.call('HGET', c, f) or '0'
end
