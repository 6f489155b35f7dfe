-- Count a failed summary and defer the community to retry_at, only while it is still queued and
-- no later claim holds it: a worker whose claim expired and was taken since must not push back a
-- mark, or count a failure, that belongs to that claim. (One that expired untaken still backs
-- off, or a summary that always outruns its claim would be retried at once, for ever.)
local P, cid, retry_at, lease, err = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local holder = redis.call('GET', P .. ':claim:' .. cid)
if holder and holder ~= lease then return 0 end
if not redis.call('ZSCORE', P .. ':stale_q', cid) then return 0 end
redis.call('ZADD', P .. ':stale_q', 'XX', retry_at, cid)
if err ~= '' then redis.call('HSET', P .. ':last_error', cid, err) end
return redis.call('HINCRBY', P .. ':failures', cid, 1)
