-- fleet_renew.lua: renews the leases of a replica's live holds under one key, so a call that
-- streams for longer than the lease keeps its permit, while a replica that died stops
-- renewing and its holds run out.
--
-- KEYS[1]  the key's holds (zset: hold id -> lease expiry, ms)
-- ARGV[1]  now, ms on the caller's clock     ARGV[2]  the lease, ms
-- ARGV[3..] the hold ids
--
-- A hold that is gone (settled, or run out and taken by someone else) or has run out is not
-- brought back: its permit may be another call's by now. Returns how many were renewed.
local now = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local expiry = string.format('%d', now + lease)
local renewed = 0
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
    renewed = renewed + 1
  end
end
if renewed > 0 and redis.call('PTTL', KEYS[1]) < lease + 1000 then
  redis.call('PEXPIRE', KEYS[1], string.format('%d', lease + 1000))
end
return renewed
