-- (after queue_fn.lua and clear_if_gen_fn.lua) Store a summary record only if the community still exists and no
-- summary of a later token was stored; then clear the mark unless the community was marked again
-- since gen (a community still marked keeps no failure count: a summary was written). Returns
-- {written, cleared}.
local P, cid, token, gen = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if redis.call('HEXISTS', P .. ':comms', cid) == 0 then return {0, 0} end
local skey = P .. ':summary:' .. cid
-- The token of the last stored summary (or drop) lives apart from the record, so that a
-- drop, which deletes the record, still fences off every earlier lease.
local stored = redis.call('HGET', P .. ':summary_token', cid) or redis.call('HGET', skey, 'token')
if stored and tonumber(stored) >= token then return {0, 0} end
redis.call('HSET', P .. ':summary_token', cid, ARGV[3])
redis.call('DEL', skey)
if #ARGV > 4 then
  for i = 5, #ARGV, 2 do redis.call('HSET', skey, ARGV[i], ARGV[i + 1]) end
end
if clear_if_gen(P, cid, gen) then return {1, 1} end
-- Marked again while it was written: still queued, but the failures before this success are
-- over, and a retry time they set would hold back the new mark.
redis.call('HDEL', P .. ':failures', cid)
redis.call('HDEL', P .. ':last_error', cid)
local rec = redis.call('HGET', P .. ':stale', cid)
if rec then redis.call('ZADD', P .. ':stale_q', 'XX', queue_score(cjson.decode(rec)), cid) end
return {1, 0}
