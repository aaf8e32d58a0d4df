-- wrk script for benchmarks/router_overhead.py: POST one small chat completion and print
-- exact figures (microseconds) in one machine-readable line when the run ends.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if os.getenv("TG_WRK_API_KEY") then
  wrk.headers["Authorization"] = "Bearer " .. os.getenv("TG_WRK_API_KEY")
end
wrk.body = os.getenv("TG_WRK_BODY")
  or '{"model":"llama-3.1-8b","messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}'

-- TG_WRK_API_KEYS="k1,k2,...": one key per request, in turn (several tenants sending).
local keys = {}
for key in string.gmatch(os.getenv("TG_WRK_API_KEYS") or "", "[^,]+") do
  keys[#keys + 1] = key
end
if #keys > 0 then
  local turn = 0
  request = function()
    turn = turn % #keys + 1
    wrk.headers["Authorization"] = "Bearer " .. keys[turn]
    return wrk.format()
  end
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "TGRESULT requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d "
      .. "connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
