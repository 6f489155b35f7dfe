-- (after clear_if_gen_fn.lua) ARGV: prefix, community id, generation. 1 when the mark was cleared.
if clear_if_gen(ARGV[1], ARGV[2], ARGV[3]) then return 1 end
return 0
