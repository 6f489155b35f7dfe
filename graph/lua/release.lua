-- Delete a key only while it still holds our value (a lease that expired may be someone else's now).
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
