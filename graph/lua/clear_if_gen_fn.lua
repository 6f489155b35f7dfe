-- Clear community cid's stale mark unless it was marked again since gen: true when cleared.
-- One Lua function, prepended to the scripts that clear a mark.
local function clear_if_gen(P, cid, gen)
  if (redis.call('HGET', P .. ':gen', cid) or '0') ~= gen then return false end
  redis.call('HDEL', P .. ':stale', cid)
  redis.call('ZREM', P .. ':stale_q', cid)
  redis.call('ZREM', P .. ':stale_first', cid)
  redis.call('DEL', P .. ':stale_docs:' .. cid)
  redis.call('HDEL', P .. ':failures', cid)
  redis.call('HDEL', P .. ':last_error', cid)
  return true
end
