-- Count a failed summary and defer the community to retry_at, only while it is still queued.
local P, cid, retry_at = ARGV[1], ARGV[2], ARGV[3]
if not redis.call('ZSCORE', P .. ':stale_q', cid) then return 0 end
redis.call('ZADD', P .. ':stale_q', 'XX', retry_at, cid)
return redis.call('HINCRBY', P .. ':failures', cid, 1)
