-- wake: hand a readiness token on (a master passing on a token it took but cannot use).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: wake
-- ARGV[1]  the token: '1' (work is claimable) or 'd' (re-read when to promote)
-- Reply: 1.
-- Side effects: pushes the token on `wake` through lib/wake.lua's wake(), so the list is
-- bounded as every verb's push bounds it (a 'd' token only while it holds under half the
-- cap); nothing is pushed on a list already at its bound.

local token = ARGV[1]
if token ~= '1' and token ~= 'd' then
  return redis.error_reply('ERR wake: the token is 1 or d, not ' .. tostring(token))
end
wake(token)
return 1
