-- The work queue's score of a stale record: its first mark; or, when a document change
-- touched a community that has a summary (rec.ahead), its first mark less a century and a
-- half, so it comes before every other mark: a summary an edit may have made wrong is
-- rewritten before a new community gets its first one (a regrouped one waits its turn). Once
-- set, it holds until the mark is cleared. One Lua function, prepended to the scripts that
-- queue a mark.
local function queue_score(rec)
  if rec.ahead then return rec.first - 5e9 end
  return rec.first
end
