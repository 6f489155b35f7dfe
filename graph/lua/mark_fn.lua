-- (after queue_fn.lua) Mark community cid stale at now and give it a new generation: marked
-- by document doc ('' for none), or asked for by an operator (asked). One Lua function,
-- prepended to the scripts that mark.
local function mark_stale(P, cid, now, doc, asked)
  local s = redis.call('HGET', P .. ':stale', cid)
  local rec
  if s then
    rec = cjson.decode(s)
    rec.last = now
    rec.count = rec.count + 1
  else
    local c = redis.call('HGET', P .. ':comms', cid)
    local level = 0
    if c then level = cjson.decode(c).level end
    rec = {level = level, first = now, last = now, count = 1}
  end
  if asked then rec.asked = true end
  if doc ~= '' and not rec.ahead and redis.call('EXISTS', P .. ':summary:' .. cid) == 1 then
    rec.ahead = true
  end
  -- A new mark is queued; a queued one moves ahead, unless a failure deferred it to its retry
  -- time (failures and that time are set and cleared together; a score compared with rec.first
  -- would not do: cjson keeps 14 digits of it, the sorted set all 17).
  if not redis.call('ZSCORE', P .. ':stale_q', cid) or redis.call('HEXISTS', P .. ':failures', cid) == 0 then
    redis.call('ZADD', P .. ':stale_q', queue_score(rec), cid)
  end
  redis.call('HSET', P .. ':stale', cid, cjson.encode(rec))
  redis.call('ZADD', P .. ':stale_first', 'NX', rec.first, cid)
  if doc ~= '' then redis.call('SADD', P .. ':stale_docs:' .. cid, doc) end
  -- From the one fencing counter, not a per-community count: a removed community's entry
  -- goes, and a count restarting at 1 when the same members come back would let a summary
  -- begun before the removal clear the new community's mark (it read generation 1 too).
  redis.call('HSET', P .. ':gen', cid, redis.call('INCR', P .. ':fence'))
end
