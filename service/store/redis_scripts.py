"""The store's Lua scripts, each naming one key's slot (or one tenant's quota slot), sent as
text with EVAL: Redis caches the compiled script by its hash anyway, and a master just promoted
or restarted then never answers NOSCRIPT mid-pipeline."""

# KEYS[1]: the session's state hash. ARGV: expected version ("0": the session must not exist),
# new version, record JSON, TTL in ms, and the record JSON the write started from ("": compare
# the version alone). Returns 1 applied, -1 no session, 0 a create that found another record, and
# on an update's mismatch the stored record, so the caller's next attempt needs no read of its own.
CAS_SCRIPT = """
local current = redis.call('HGET', KEYS[1], 'version')
if ARGV[1] == '0' then
  if current then
    -- A create retried after a dropped connection: the same record is already there.
    if redis.call('HGET', KEYS[1], 'record') == ARGV[3] then
      redis.call('PEXPIRE', KEYS[1], ARGV[4])
      return 1
    end
    return 0
  end
elseif not current then
  return -1
else
  local stored = redis.call('HGET', KEYS[1], 'record')
  if current ~= ARGV[1] or (ARGV[5] ~= '' and stored ~= ARGV[5]) then
    return stored or 0
  end
end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'record', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# Per-tenant quotas. KEYS[1]: zset member → expiry (ms) of what is counted; KEYS[2]: hash
# member → bytes (instances; sessions pass KEYS[1] again). ARGV: member, its expiry (ms), now (ms),
# max count, its bytes, max bytes (-1: no limit). Members past their expiry are dropped first;
# reads slide the scores as they slide the TTLs (ZADD XX), so the count is what is alive.
# Returns {1} admitted (or already counted), {0, 1, count} over the count, {0, 2, bytes} over
# the bytes.
ADMIT_SCRIPT = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
  if KEYS[2] ~= KEYS[1] then redis.call('HDEL', KEYS[2], unpack(expired)) end
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  return {1}
end
local count = redis.call('ZCARD', KEYS[1])
local max_count = tonumber(ARGV[4])
if max_count >= 0 and count >= max_count then return {0, 1, count} end
local max_bytes = tonumber(ARGV[6])
if max_bytes >= 0 then
  local total = 0
  for _, size in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(size) end
  if total + tonumber(ARGV[5]) > max_bytes then return {0, 2, total} end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
if KEYS[2] ~= KEYS[1] then redis.call('HSET', KEYS[2], ARGV[1], ARGV[5]) end
return {1}
"""

# KEYS[1]: the session's state hash. ARGV[1]: TTL in ms. The record, its TTL slid, or nil.
READ_SCRIPT = """
local record = redis.call('HGET', KEYS[1], 'record')
if record then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return record
"""

# KEYS[1]: an instance's exposure counts (a hash). ARGV[1]: the instance TTL in ms, then field,
# increment pairs. A field holding anything but a count HINCRBY could have written (a hand edit,
# a bug) starts again from its increment: HINCRBY would fail on it at every later step.
EXPOSURE_SCRIPT = """
for i = 2, #ARGV, 2 do
  local held = redis.call('HGET', KEYS[1], ARGV[i])
  if held and not (held == '0' or (#held <= 18 and string.match(held, '^[1-9]%d*$'))) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  else
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

# KEYS[1]: an instance's exposure counts (a hash). ARGV[1]: a share of the sessions. The hash's
# fields but the tests given fewer times than that share of the sessions; a value that is no
# number is returned, for the caller to see it is damaged.
EXPOSURE_READ_SCRIPT = """
local fields = redis.call('HGETALL', KEYS[1])
local sessions = tonumber(redis.call('HGET', KEYS[1], 'sessions')) or 0
local least = tonumber(ARGV[1]) * sessions
local kept = {}
for i = 1, #fields, 2 do
  local count = tonumber(fields[i + 1])
  if fields[i] == 'sessions' or count == nil or count >= least then
    kept[#kept + 1] = fields[i]
    kept[#kept + 1] = fields[i + 1]
  end
end
return kept
"""
