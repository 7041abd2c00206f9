-- fleet_pause.lua: publishes the upstream's pause for a key, so every replica stops sending
-- until it ends, not just the one that saw the 429 or the `remaining = 0` header.
--
-- KEYS[1]  the key's pause (string: paused until, ms on the callers' clock)
-- ARGV[1]  now, ms              ARGV[2]  the pause, ms (at least 1)
--
-- A later pause wins, an earlier one changes nothing (a plain SET would let a short pause cut
-- a long one). The key expires with the pause. Returns 1 when the pause was set or
-- lengthened, 0 when a pause at least as long was there.
local until_ms = tonumber(ARGV[1]) + tonumber(ARGV[2])
local current = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if current >= until_ms then
  return 0
end
redis.call('SET', KEYS[1], string.format('%d', until_ms), 'PX', ARGV[2])
return 1
