-- (after mark_fn.lua) Replace one document's contribution to the entity graph (KEYS[1]; ARGV: prefix, doc id, new JSON
-- or '' to delete, version or '', now, refresh '1'/'0'): subtract the old, add the new, and mark stale
-- every community of every touched entity: one the doc gains or loses, whose passages (its
-- fingerprint, the 4th field; none stored = changed) or edges changed. An edit of text that names
-- no entity touches none. A delete also adds the communities it marks to the set of summaries to
-- withdraw (they may quote what was deleted), and, replays included, returns that set: the
-- caller withdraws them and takes each out. Returns {applied, touched entity keys, marked
-- community ids, communities whose summaries await withdrawal}.
local P, doc, newj, ver, now, refresh = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local function done(applied, keys, cids)
  if newj ~= '' then return {applied, keys, cids, '[]'} end
  local pending = redis.call('SMEMBERS', P .. ':withdraw')
  if #pending == 0 then return {applied, keys, cids, '[]'} end
  return {applied, keys, cids, cjson.encode(pending)}
end
local function vgt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
-- A set's members in commands of 1,000 (unpack's limit is ~8,000): one call per chunk id
-- made a doc's change cost a Lua-to-Redis call per mention.
local function members(cmd, key, list)
  for i = 1, #list, 1000 do redis.call(cmd, key, unpack(list, i, math.min(i + 999, #list))) end
end
local oldj = redis.call('GET', KEYS[1])
local old = nil
if oldj then old = cjson.decode(oldj) end
if refresh == '1' then
  -- a re-chunked doc: replaces only a live contribution of its own version (never an older or
  -- newer one, a delete's tombstone, or an unversioned one)
  if ver == '' or not old or old.v ~= ver or old.d then return done(0, '[]', '[]') end
elseif ver ~= '' and old and type(old.v) == 'string' and not vgt(ver, old.v) then
  return done(0, '[]', '[]')  -- a replay
elseif ver == '' and oldj and oldj == newj then
  return done(0, '[]', '[]')  -- an unversioned item delivered again, unchanged (at-least-once)
end
-- Other docs' entities, each doc's contribution decoded once per script: decoded once per
-- shared entity, the delete of a copy of a large doc (~1 MB record) holds Redis for a minute.
local others = {}
local function stated_elsewhere(key)
  for _, e in pairs(others) do
    if e[key] then return e[key] end
  end
  local d = redis.call('SRANDMEMBER', P .. ':ent_docs:' .. key)
  local other = d and redis.call('GET', P .. ':contrib:' .. d)
  if not other then return nil end
  others[d] = cjson.decode(other).e
  return others[d][key]
end
local touched, inold, innew, delta = {}, {}, {}, {}
local new = nil
if newj ~= '' then new = cjson.decode(newj) end
if old then
  for key, info in pairs(old.e) do
    local ni = new and new.e[key]
    if not ni or not info[4] or ni[4] ~= info[4] then touched[key] = true end
    inold[key] = true
    redis.call('SREM', P .. ':ent_docs:' .. key, doc)
    members('SREM', P .. ':ent_chunks:' .. key, info[3])
    if redis.call('SCARD', P .. ':ent_docs:' .. key) == 0 then
      redis.call('HDEL', P .. ':nodes', key)
      redis.call('DEL', P .. ':ent_chunks:' .. key)
    elseif redis.call('HGET', P .. ':nodes', key) == cjson.encode({info[1], info[2]}) then
      -- this doc may have set the node's name and type: take them from its new version if it
      -- still mentions the entity, else from a document that still does, so they are never
      -- ones no document states
      local oi = (new and new.e[key]) or stated_elsewhere(key)
      if oi then redis.call('HSET', P .. ':nodes', key, cjson.encode({oi[1], oi[2]})) end
    end
  end
  for _, e in ipairs(old.x) do
    local f = e[1] .. '\31' .. e[2]
    delta[f] = (delta[f] or 0) - e[3]
    local w = redis.call('HINCRBY', P .. ':edges', f, -e[3])
    if w <= 0 then redis.call('HDEL', P .. ':edges', f) end
  end
end
if new then
  for key, info in pairs(new.e) do
    if not (old and old.e[key]) then touched[key] = true end
    innew[key] = true
    redis.call('HSETNX', P .. ':nodes', key, cjson.encode({info[1], info[2]}))
    redis.call('SADD', P .. ':ent_docs:' .. key, doc)
    members('SADD', P .. ':ent_chunks:' .. key, info[3])
  end
  for _, e in ipairs(new.x) do
    local f = e[1] .. '\31' .. e[2]
    delta[f] = (delta[f] or 0) + e[3]
    redis.call('HINCRBY', P .. ':edges', f, e[3])
  end
  redis.call('SET', KEYS[1], newj)
  redis.call('ZADD', P .. ':docs', 0, doc)  -- the docs with a contribution, by id (a forget's listing)
elseif ver ~= '' then
  redis.call('SET', KEYS[1], cjson.encode({v = ver, e = {}, x = {}, d = 1}))  -- a delete's tombstone
  redis.call('ZREM', P .. ':docs', doc)
else
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', P .. ':docs', doc)
end
local drift = 0
for key, _ in pairs(touched) do
  if (inold[key] or false) ~= (innew[key] or false) then drift = drift + 1 end
end
for f, d in pairs(delta) do
  if d ~= 0 then
    drift = drift + 1
    local sep = string.find(f, '\31', 1, true)
    touched[string.sub(f, 1, sep - 1)] = true
    touched[string.sub(f, sep + 1)] = true
  end
end
if drift > 0 then redis.call('INCRBY', P .. ':drift', drift) end
local marked, keys = {}, {}
for key, _ in pairs(touched) do
  table.insert(keys, key)
  local cj = redis.call('HGET', P .. ':ent_comm', key)
  if cj then
    for _, cid in ipairs(cjson.decode(cj)) do marked[cid] = true end
  end
end
local cids = {}
for cid, _ in pairs(marked) do
  table.insert(cids, cid)
  mark_stale(P, cid, now, doc, false)
end
if newj == '' then members('SADD', P .. ':withdraw', cids) end
return done(1, cjson.encode(keys), cjson.encode(cids))
