-- wrk script: POST one run.usage CloudEvent per request, each with a unique id.
-- The body matches bench/loadgen.py's single_event_body; arguments (after --):
--   key prefix time runs_per_thread
-- Prints one JSON line with the totals and p50/p99 in milliseconds.

local threads = {}
local counter = 1

function setup(thread)
   thread:set("tid", counter)
   counter = counter + 1
   table.insert(threads, thread)
end

function init(args)
   key = args[1]
   prefix = args[2]
   when = args[3]
   runs = tonumber(args[4])
   seq = 0
   stream = prefix .. tid
   headers = {}
   headers["Content-Type"] = "application/cloudevents+json"
   if key ~= "" then
      headers["Authorization"] = "Bearer " .. key
   end
end

function request()
   local run = seq % runs
   local body = string.format(
      '{"specversion":"1.0","id":"%s-%d","source":"bench/single","type":"run.usage",' ..
      '"subject":"run-%s-%d","time":"%s","data":{"customer":"cust-%d","step":%d,' ..
      '"model":"agent-large-1","input_tokens":1200,"output_tokens":350}}',
      stream, seq, stream, run, when, run % 16, seq + 1)
   seq = seq + 1
   return wrk.format("POST", "/v1/events", headers, body)
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      '{"requests":%d,"errors":%d,"elapsed_s":%.3f,"p50_ms":%.2f,"p99_ms":%.2f}\n',
      summary.requests, e.connect + e.read + e.write + e.status + e.timeout,
      summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
