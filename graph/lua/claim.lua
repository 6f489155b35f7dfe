-- A claim is taken only while the community is due (still stale, its backoff over), so a
-- worker that read an old due list never redoes what another worker just finished. The
-- claim's value carries a fencing token from one counter: later claims get larger tokens.
local P, cid, owner, ttl, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local score = redis.call('ZSCORE', P .. ':stale_q', cid)
if not score or tonumber(score) > now then return 0 end
local token = redis.call('INCR', P .. ':fence')
if not redis.call('SET', P .. ':claim:' .. cid, owner .. '|' .. token, 'NX', 'PX', ttl) then return 0 end
return token
