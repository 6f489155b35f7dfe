-- (after mark_fn.lua) Mark communities stale at an operator's request (a new summarizer):
-- ARGV: prefix, now, community ids. A community no longer in the map is passed over.
-- Returns {how many were marked, how many of them were queued already}.
local P, now = ARGV[1], tonumber(ARGV[2])
local n, queued = 0, 0
for i = 3, #ARGV do
  if redis.call('HEXISTS', P .. ':comms', ARGV[i]) == 1 then
    if redis.call('HEXISTS', P .. ':stale', ARGV[i]) == 1 then queued = queued + 1 end
    mark_stale(P, ARGV[i], now, '', true)
    n = n + 1
  end
end
return {n, queued}
