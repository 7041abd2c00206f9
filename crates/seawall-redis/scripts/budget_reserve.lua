-- Reserves one attempt's estimate on every line of its charge, or on none.
--
-- KEYS[1]: the attempt's id record; then per line i: KEYS[2i] the counter hash, KEYS[2i+1]
-- its lease set.
-- ARGV: now (ms), lease end (ms), id record ttl (ms), amount, lease member; then per line
-- five: limit, window kind (t, c, r), window argument, soft threshold ('' for none),
-- counter ttl (ms, 0 for none).
--
-- Returns {'ok', settled1, reserved1, ...} (each line after the admission), {'no', i,
-- settled, reserved} when line i refused (nothing was reserved), or {'seen'} when this id
-- was already seen: a repeated reservation (a retry after a timeout) is a no-op.
--
-- Atomic: Redis runs the script alone, so every line is checked and then every line taken
-- with no other admission in between; that is what makes the budget hold for the fleet.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'seen'}
end
local now = tonumber(ARGV[1])
local amount = tonumber(ARGV[4])
local lines = (#KEYS - 1) / 2
for i = 1, lines do
  local c, l, a = KEYS[2 * i], KEYS[2 * i + 1], 5 + (i - 1) * 5
  bring(c, l, now, ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
  local settled, reserved = field(c, 'settled'), field(c, 'reserved')
  if tonumber(settled) + tonumber(reserved) + amount > tonumber(ARGV[a + 1]) then
    return {'no', tostring(i), settled, reserved}
  end
end
local out = {'ok'}
for i = 1, lines do
  local c, l, a = KEYS[2 * i], KEYS[2 * i + 1], 5 + (i - 1) * 5
  redis.call('HINCRBY', c, 'reserved', ARGV[4])
  redis.call('ZADD', l, ARGV[2], ARGV[5])
  keep(c, l, ARGV[a + 5])
  out[#out + 1] = field(c, 'settled')
  out[#out + 1] = field(c, 'reserved')
end
redis.call('SET', KEYS[1], 'r', 'PX', ARGV[3])
return out
