-- Replaces one attempt's reservation by its cost (zero for a release), once per id.
--
-- KEYS: as budget_reserve.lua.
-- ARGV: now (ms), id record ttl (ms), amount, lease member, cost; then per line four: window
-- kind, window argument, soft threshold ('' for none), counter ttl (ms).
--
-- Returns the soft thresholds crossed: {i, settled, ...}, each line at most once per window.
--
-- Idempotent: the id record is marked 'd' (done), and a repeated settlement (a retry after a
-- timeout) does nothing. A settlement whose reservation is gone (its lease ended, or it was
-- never made because the reservation timed out before it ran) still charges its cost and
-- marks the id, so a reservation arriving late is a no-op too.
if redis.call('GET', KEYS[1]) == 'd' then
  return {}
end
local now = tonumber(ARGV[1])
local lines = (#KEYS - 1) / 2
local crossed = {}
for i = 1, lines do
  local c, l, a = KEYS[2 * i], KEYS[2 * i + 1], 5 + (i - 1) * 4
  local soft = ARGV[a + 3]
  bring(c, l, now, ARGV[a + 1], ARGV[a + 2], soft)
  if redis.call('ZREM', l, ARGV[4]) == 1 then
    local left = num(redis.call('HGET', c, 'reserved')) - tonumber(ARGV[3])
    if left < 0 then left = 0 end
    redis.call('HSET', c, 'reserved', string.format('%d', left))
  end
  redis.call('HINCRBY', c, 'settled', ARGV[5])
  if ARGV[a + 1] == 'r' then
    local slot = 's' .. string.format('%d', tonumber(redis.call('HGET', c, 'head')) % RING)
    redis.call('HINCRBY', c, slot, ARGV[5])
  end
  if soft ~= '' and field(c, 'soft') ~= '1' then
    local settled = field(c, 'settled')
    if tonumber(settled) >= tonumber(soft) then
      redis.call('HSET', c, 'soft', '1')
      crossed[#crossed + 1] = tostring(i)
      crossed[#crossed + 1] = settled
    end
  end
  keep(c, l, ARGV[a + 4])
end
redis.call('SET', KEYS[1], 'd', 'PX', ARGV[2])
return crossed
