"""The Lua scripts that make every shared update atomic on Redis (one EVALSHA each).

Time is Redis's own clock (`TIME`, whole microseconds) so replicas with skewed clocks
agree. The arithmetic mirrors `gateway.state.ledger` exactly; `docs/state.md` lists
the keys. Every script touches only the keys passed in KEYS, and every key carries the
same `{prefix}` hash tag, so they also run on one Redis Cluster slot.

Concurrency slots: each admitted request is a field `<replica>|<n>` of the tenant's
`slots` hash; a release deletes it. Adding and deleting a named field is idempotent,
so a replica can rewrite its own fields from what it holds (a resync) without racing
its own calls. The tenant's `held` hash keeps each replica's field count, changed in
the same script as the fields, so an admission sums a few counts instead of scanning
every slot. A replica's count stops counting when its lease (in `leases`) runs out.
"""

from __future__ import annotations

__all__ = [
    "ACQUIRE",
    "HEARTBEAT",
    "LEAVE",
    "RELEASE",
    "RESERVE",
    "RESTORE",
    "RESTORE_BATCH",
    "REVOKE",
]

# The most rate keys one RESTORE call touches (about 5 ms of Redis time, measured at
# 22 ms per 1,000 tenants): a restore of more is a run of calls.
RESTORE_BATCH = 256

_COMMON = """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function us(x) return string.format('%.0f', x) end
local function owner(field)
  local sep = string.find(field, '|', 1, true)
  return sep and string.sub(field, 1, sep - 1)
end
-- Delete every slot field of `replica` (rare: a dead replica, a resync, a goodbye).
local function drop_fields(slots, replica, keep, skip)
  for _, field in ipairs(redis.call('HKEYS', slots)) do
    if owner(field) == replica and not keep[field] and not skip[field] then
      redis.call('HDEL', slots, field)
    end
  end
end
"""

# KEYS: leases, slots of the tenant, held counts of the tenant, rpm TAT, tpm TAT
# ARGV: replica, lease ttl ms, concurrent, rpm, tpm (0 = no such limit),
#       concurrency retry us, this admission's slot field ('' without a concurrency limit)
# -> {1} admitted | {0, which, wait_us} refused (1 concurrent, 2 rpm, 3 tpm) | {-1} no lease
ACQUIRE = (
    _COMMON
    + """
local now = now_us()
local me = ARGV[1]
local lease = tonumber(redis.call('HGET', KEYS[1], me))
if not lease or lease < now then return {-1} end
local ttl = tonumber(ARGV[2])
local conc, rpm, tpm = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local wait, which = 0, 0
if conc > 0 then
  local counts = redis.call('HGETALL', KEYS[3])
  local held, others, numbers = 0, {}, {}
  for i = 1, #counts, 2 do
    if counts[i] == me then
      held = held + tonumber(counts[i + 1])
    else
      others[#others + 1] = counts[i]
      numbers[#numbers + 1] = tonumber(counts[i + 1])
    end
  end
  if #others > 0 then
    local leases = redis.call('HMGET', KEYS[1], unpack(others))
    for i = 1, #others do
      local until_us = tonumber(leases[i])
      if until_us and until_us >= now then
        held = held + numbers[i]
      else
        redis.call('HDEL', KEYS[3], others[i])
        drop_fields(KEYS[2], others[i], {}, {})
      end
    end
  end
  if held >= conc then wait, which = tonumber(ARGV[6]), 1 end
end
local interval, base = 0, now
if rpm > 0 then
  interval = math.max(1, math.floor((60000000 + math.floor(rpm / 2)) / rpm))
  base = math.max(tonumber(redis.call('GET', KEYS[4])) or now, now)
  local over = base - now - (rpm - 1) * interval
  if over > 0 and over > wait then wait, which = over, 2 end
end
if tpm > 0 then
  local over = (tonumber(redis.call('GET', KEYS[5])) or now) - now - 60000000
  if over >= 0 and over + 1 > wait then wait, which = over + 1, 3 end
end
if which > 0 then return {0, which, wait} end
if rpm > 0 then
  local tat = base + interval
  redis.call('SET', KEYS[4], us(tat), 'PX', math.floor((tat - now) / 1000) + 1)
end
if conc > 0 then
  if redis.call('HSET', KEYS[2], ARGV[7], 1) == 1 then redis.call('HINCRBY', KEYS[3], me, 1) end
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return {1}
"""
)

_TOKENS = """
local function tokens_cost(tokens, tpm)
  return math.floor((tokens * 60000000 + math.floor(tpm / 2)) / tpm)
end
local function set_tat(key, tat, now)
  if tat <= now then
    redis.call('DEL', key)  -- a full budget
  else
    redis.call('SET', key, us(tat), 'PX', math.floor((tat - now) / 1000) + 1)
  end
end
"""

# KEYS: tpm TAT; ARGV: tpm, tokens (at most tpm are reserved), most debt (us)
# -> {1} reserved | {0, wait_us} refused
RESERVE = (
    _COMMON
    + _TOKENS
    + """
local tpm = tonumber(ARGV[1])
local tokens = math.min(tonumber(ARGV[2]), tpm)
local now = now_us()
local cost = tokens_cost(tokens, tpm)
local base = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now)
local over = base + cost - now - 60000000
if over > 0 then return {0, over} end
set_tat(KEYS[1], math.min(base + cost, now + tonumber(ARGV[3])), now)
return {1}
"""
)

# KEYS: slots of the tenant, held counts of the tenant, tpm TAT
# ARGV: replica, slot field ('' = none), tpm (0 = none), tokens reserved here by
#       `RESERVE`, tokens used, most debt (us)
# The reservation is replaced by the tokens used (ledger.settled_tat).
RELEASE = (
    _COMMON
    + _TOKENS
    + """
local me = ARGV[1]
if ARGV[2] ~= '' and redis.call('HDEL', KEYS[1], ARGV[2]) == 1 then
  if redis.call('HINCRBY', KEYS[2], me, -1) <= 0 then redis.call('HDEL', KEYS[2], me) end
end
local tpm, reserved, used = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if tpm > 0 and (reserved > 0 or used > 0) then
  local delta = tokens_cost(used, tpm) - tokens_cost(reserved, tpm)
  if delta ~= 0 then
    local now = now_us()
    local tat = tonumber(redis.call('GET', KEYS[3])) or now
    if delta < 0 then
      tat = math.max(tat + delta, now)
    else
      tat = math.min(math.max(tat, now) + delta, now + tonumber(ARGV[6]))
    end
    set_tat(KEYS[3], tat, now)
  end
end
return 1
"""
)

# KEYS: leases, in-flight hash, revoked set, revoked version, epoch, then for each
#       tenant listed in ARGV its slots and its held counts
# ARGV: replica, lease ttl ms, resync (1/0), the epoch its RESTORE just answered, n
#       backends, (backend, count) * n, then per tenant: slots held here, n keep, keep
#       fields..., n skip, skip fields...
# Resync: this replica's slot fields become exactly `keep` (fields in `skip` belong to
#       calls still in flight: their outcome decides), its count their number, and its
#       in-flight fields exactly the backends sent. A resync follows a RESTORE; if Redis
#       lost its data since (another epoch, or none), the lease is not taken: that
#       restore's budgets went with the data, and a live lease would keep the next
#       RESTORE from putting them back.
# -> {-1} lease lost and no resync asked (ask again with one) |
#    {-2} resync asked but Redis lost its data since the restore (restore again) |
#    {resynced, live replicas, revoked version, revoked count, (backend, others' sum)...}
HEARTBEAT = (
    _COMMON
    + """
local now = now_us()
local me, ttl = ARGV[1], tonumber(ARGV[2])
local resync = ARGV[3] == '1'
local lease = tonumber(redis.call('HGET', KEYS[1], me))
if (not lease or lease < now) and not resync then return {-1} end
if resync and redis.call('GET', KEYS[5]) ~= ARGV[4] then return {-2} end
redis.call('HSET', KEYS[1], me, us(now + ttl * 1000))
redis.call('PEXPIRE', KEYS[1], ttl)
local pos = 6
local sent = {}
for _ = 1, tonumber(ARGV[5]) do
  local field, n = me .. '|' .. ARGV[pos], tonumber(ARGV[pos + 1])
  pos = pos + 2
  sent[field] = true
  if n > 0 then
    redis.call('HSET', KEYS[2], field, n)
  else
    redis.call('HDEL', KEYS[2], field)
  end
end
if resync then
  for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
    if owner(field) == me and not sent[field] then redis.call('HDEL', KEYS[2], field) end
  end
end
redis.call('PEXPIRE', KEYS[2], ttl)
for k = 6, #KEYS, 2 do
  local slots, counts = KEYS[k], KEYS[k + 1]
  local held = tonumber(ARGV[pos])
  local keep, skip = {}, {}
  pos = pos + 1
  for _ = 1, tonumber(ARGV[pos]) do
    pos = pos + 1
    keep[ARGV[pos]] = true
  end
  pos = pos + 1
  for _ = 1, tonumber(ARGV[pos]) do
    pos = pos + 1
    skip[ARGV[pos]] = true
  end
  pos = pos + 1
  if resync then
    drop_fields(slots, me, keep, skip)
    for field in pairs(keep) do redis.call('HSET', slots, field, 1) end
    local mine = 0
    for _, field in ipairs(redis.call('HKEYS', slots)) do
      if owner(field) == me then mine = mine + 1 end
    end
    if mine > 0 then
      redis.call('HSET', counts, me, mine)
    else
      redis.call('HDEL', counts, me)
    end
  end
  if held > 0 then
    redis.call('PEXPIRE', slots, ttl)
    redis.call('PEXPIRE', counts, ttl)
  end
end
local live, nlive = {}, 0
local leases = redis.call('HGETALL', KEYS[1])
for i = 1, #leases, 2 do
  if tonumber(leases[i + 1]) >= now then
    live[leases[i]] = true
    nlive = nlive + 1
  else
    redis.call('HDEL', KEYS[1], leases[i])
  end
end
local sums, order = {}, {}
local fields = redis.call('HGETALL', KEYS[2])
for i = 1, #fields, 2 do
  local field = fields[i]
  local replica = owner(field)
  if not replica or not live[replica] then
    redis.call('HDEL', KEYS[2], field)
  elseif replica ~= me then
    -- what a replica writes: a backend id (at most 63 bytes), a count >= 0; not another's
    local backend, n = string.sub(field, #replica + 2), tonumber(fields[i + 1])
    if #backend <= 63 and n and n >= 0 and n == math.floor(n) and n < 2^31 then
      if not sums[backend] then
        sums[backend] = 0
        order[#order + 1] = backend
      end
      sums[backend] = sums[backend] + n
    end
  end
end
local out = {resync and 1 or 0, nlive, tonumber(redis.call('GET', KEYS[4])) or 0,
             redis.call('SCARD', KEYS[3])}
for _, backend in ipairs(order) do
  out[#out + 1] = backend
  out[#out + 1] = sums[backend]
end
return out
"""
)

# KEYS: revoked set, revoked version; ARGV: key hashes -> the version after
# The version is a time in microseconds, moved on at every change: it never repeats an
# earlier value, even after Redis lost its data and replicas rebuild the set.
REVOKE = (
    _COMMON
    + """
local added = 0
for i = 1, #ARGV do added = added + redis.call('SADD', KEYS[1], ARGV[i]) end
local version = tonumber(redis.call('GET', KEYS[2]))
if added > 0 or not version then
  version = math.max(now_us(), (version or 0) + 1)
  redis.call('SET', KEYS[2], us(version))
end
return version
"""
)

# KEYS: leases, in-flight hash, then for each tenant its slots and its held counts
# ARGV: replica. A replica that shuts down cleanly takes its counts and slots with it
# instead of leaving them to its lease.
LEAVE = (
    _COMMON
    + """
local me = ARGV[1]
redis.call('HDEL', KEYS[1], me)
for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
  if owner(field) == me then redis.call('HDEL', KEYS[2], field) end
end
for k = 3, #KEYS, 2 do
  drop_fields(KEYS[k], me, {}, {})
  redis.call('HDEL', KEYS[k + 1], me)
end
return 1
"""
)

# KEYS: leases, epoch, restored, then rate keys (a tenant's rpm or tpm TAT), a batch of
#       at most `RESTORE_BATCH` of them: a replica's restore is a run of such calls, so
#       none holds Redis for long whatever the tenant count (`RedisState._restore`)
# ARGV: replica, the epoch it last saw ('' none yet), a new epoch, this process's token,
# the epoch the run's first call answered ('' in that first call), the position of the
# batch's first key in the run's list, then for each rate key the backlog (us) this
# replica's ledger holds of it
# -> {0, epoch} lease live | {1, epoch} restored (a max) | {2, epoch} Redis lost its data
#    | {3, epoch} Redis lost its data again since the run began (start the run over)
# Run before a resync renews the lease: a replica whose lease is gone puts back what it
# knows of each budget. The epoch (set once, never expiring) tells why the lease went:
# another epoch, or none, means Redis lost its data (a restart, a FLUSHALL), and every
# replica adds its own backlog, so they sum to what was spent; the same one means only
# this replica's lease ran out (a stall), the keys are still there, and a max keeps
# what was spent from being charged twice. A replica that saw none yet ('') adds too:
# it never held a lease, so whatever it admitted was decided locally (its first RESTORE
# precedes its first HEARTBEAT), and Redis holds none of it. `restored` keeps, for two
# minutes, how far into its run each replica (process: a restarted one with the same id
# has a new token) added into the epoch, as `epoch|token|count`: a batch sent again (its
# reply was lost) takes a max for the keys before `count` instead of adding twice, and
# a run cut off half-way (the replica died, a call failed) claims only what it added.
RESTORE = (
    _COMMON
    + """
local now = now_us()
local me = ARGV[1]
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  epoch = ARGV[3]
  redis.call('SET', KEYS[2], epoch)
end
if ARGV[5] ~= '' and ARGV[5] ~= epoch then return {3, epoch} end
local lease = tonumber(redis.call('HGET', KEYS[1], me))
if lease and lease >= now then return {0, epoch} end
local lost = ARGV[2] ~= '' and ARGV[2] ~= epoch
local adding = ARGV[2] ~= epoch
local mark = epoch .. '|' .. ARGV[4] .. '|'
local first = tonumber(ARGV[6])
local done = 0
if adding then
  local prev = redis.call('HGET', KEYS[3], me)
  if prev and string.sub(prev, 1, #mark) == mark then
    done = tonumber(string.sub(prev, #mark + 1)) or 0
  end
end
for i = 4, #KEYS do
  local backlog = tonumber(ARGV[i + 3])
  if backlog > 0 then
    local old = tonumber(redis.call('GET', KEYS[i])) or 0
    local tat = now + backlog
    if adding and first + i - 4 >= done then tat = math.max(old, now) + backlog end
    if old < tat then
      redis.call('SET', KEYS[i], us(tat), 'PX', math.floor((tat - now) / 1000) + 1)
    end
  end
end
if adding then
  redis.call('HSET', KEYS[3], me, mark .. math.max(done, first + #KEYS - 3))
  redis.call('PEXPIRE', KEYS[3], 120000)
end
return {lost and 2 or 1, epoch}
"""
)
