-- Reads one counter, brought up to now (expired leases given back, the window rolled).
--
-- KEYS[1] the counter hash, KEYS[2] its lease set.
-- ARGV: now (ms), window kind, window argument, soft threshold ('' for none), counter ttl
-- (ms, 0 for none).
--
-- Returns {settled, reserved}.
bring(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4])
keep(KEYS[1], KEYS[2], ARGV[5])
return {field(KEYS[1], 'settled'), field(KEYS[1], 'reserved')}
