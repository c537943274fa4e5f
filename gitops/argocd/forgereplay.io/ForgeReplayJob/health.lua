-- Argo CD health check for forgereplay.io/ForgeReplayJob.
--
-- A ForgeReplayJob is a run-to-completion resource (like a batch Job): it is Healthy only once it
-- has Succeeded, so an Argo CD sync (or a sync wave) that includes one waits for the replay to pass.
--   Failed, or Stalled=True, or SpecValid=False -> Degraded (checked first: a change refused after the job
--                                               succeeded is Degraded, as kstatus reads Stalled=True: Failed)
--                                               (an out-of-memory is Failed, reason OutOfMemory: Degraded)
--   Succeeded                                -> Healthy (a run that ran out of memory as spec.expect.outcome
--                                               expects is Succeeded too; the message ends with the outcome;
--                                               a verdict not met in shadow mode, ExpectationsMet=False reason
--                                               ExpectationsNotMetShadow, is Healthy and said in the message)
--   Suspended                                -> Suspended
--   Pending / Verifying / Launching / Running -> Progressing
-- A status the operator wrote for an older generation of the spec says nothing about the current
-- spec: it is Progressing until status.observedGeneration catches up with metadata.generation.
-- Argo CD runs this with gopher-lua (Lua 5.1) and only the package, base, table and a safe os library:
-- no string.* or math.* calls here.

local function condition(status, wanted)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

-- The first argument that is a non-empty string (arguments may be nil or false).
local function first_message(...)
  for i = 1, select("#", ...) do
    local m = select(i, ...)
    if type(m) == "string" and m ~= "" then
      return m
    end
  end
  return ""
end

-- status.outcome, once the run has ended: fits, overBudget, outOfMemory or failed.
local function outcome(status)
  if status.outcome ~= nil and status.outcome ~= "" then
    return ", outcome " .. tostring(status.outcome)
  end
  return ""
end

-- A verdict recorded in shadow mode (spec.expect.enforce: false): not met, not enforced.
local function shadow(status)
  local met = condition(status, "ExpectationsMet")
  if met ~= nil and met.status == "False" and met.reason == "ExpectationsNotMetShadow" then
    return "; " .. first_message(met.message, "expectations not met (shadow mode, not enforced)")
  end
  return ""
end

local function progress(status)
  if status.rollouts ~= nil and status.rollouts.total ~= nil then
    return " (rollouts " .. tostring(status.rollouts.completed or 0) .. "/" .. tostring(status.rollouts.total) .. ")"
  end
  return ""
end

local hs = {}
local status = obj.status

if status == nil or status.phase == nil or status.phase == "" then
  hs.status = "Progressing"
  hs.message = "Waiting for the forge-replay operator to report a status"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation) ..
    " (status is for generation " .. tostring(status.observedGeneration or "none") .. ")"
  return hs
end

local ready = condition(status, "Ready")
local stalled = condition(status, "Stalled")
local spec_valid = condition(status, "SpecValid")
local phase = status.phase

if phase == "Failed" or (stalled ~= nil and stalled.status == "True") or
   (spec_valid ~= nil and spec_valid.status == "False") then
  hs.status = "Degraded"
  hs.message = first_message(stalled and stalled.message, spec_valid and spec_valid.status == "False" and spec_valid.message,
    ready and ready.message, status.message, "Replay failed")
  return hs
end

if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = first_message(ready and ready.message, status.message, "Replay succeeded") .. progress(status) ..
    outcome(status) .. shadow(status)
  return hs
end

if phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = first_message(status.message, "Suspended (spec.suspend is true)") .. progress(status)
  return hs
end

if phase == "Pending" or phase == "Verifying" or phase == "Launching" or phase == "Running" then
  local reconciling = condition(status, "Reconciling")
  hs.status = "Progressing"
  hs.message = phase .. ": " .. first_message(reconciling and reconciling.message, status.message, ready and ready.message,
    "in progress") .. progress(status)
  return hs
end

hs.status = "Unknown"
hs.message = "Unknown phase " .. tostring(phase) .. ": is the forge-replay operator newer than this health check?"
return hs
