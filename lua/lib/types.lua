-- types: the key-type checks a verb makes before its first write, so that a key of the wrong
-- type refuses the call with nothing written.
-- Includes: core

-- The error text naming a key of the wrong type (the module's is the same).
local function wrong_type(key, want)
  return 'WRONGTYPE emq: ' .. key .. ' holds a ' .. type_of(key) .. ', not a ' .. want
end

-- The first of keys ({key, type}...) that is neither missing nor of its type, as
-- wrong_type's text; nil when all fit. misfit(key, want): that one key, with no table (the
-- checks every call of a hot verb makes; no local of its own: a verb has few to spare).
local function misfit(keys, want)
  if want then
    local t = type_of(keys)
    if t ~= 'none' and t ~= want then return wrong_type(keys, want) end
    return nil
  end
  for _, kw in ipairs(keys) do
    local t = type_of(kw[1])
    if t ~= 'none' and t ~= kw[2] then return wrong_type(kw[1], kw[2]) end
  end
  return nil
end
