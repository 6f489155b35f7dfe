-- Count a failed summary and defer the community to retry_at, only while it is still queued and
-- the failing worker's claim (owner|token) still stands: a worker whose claim expired must not
-- push back a mark, or count a failure, that belongs to a later claim.
local P, cid, retry_at, lease = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if redis.call('GET', P .. ':claim:' .. cid) ~= lease then return 0 end
if not redis.call('ZSCORE', P .. ':stale_q', cid) then return 0 end
redis.call('ZADD', P .. ':stale_q', 'XX', retry_at, cid)
return redis.call('HINCRBY', P .. ':failures', cid, 1)
