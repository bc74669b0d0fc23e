-- The one wrk script of the load benchmark (benches/load/run.py sets its environment).
--
--   BENCH_HEADER_NAME / BENCH_HEADER_VALUE  a fixed extra header on every request
--   BENCH_VARY_HEADER   a header that gets a new value on every request (distinct rate-limit keys);
--                       this defines request(), which makes wrk call Lua once per request
--   BENCH_VARY_COUNT    how many distinct values; the thread stops after sending that many
--   BENCH_VARY_OFFSET   first value (so that warm-up keys and measured keys differ)
--
-- done() prints one line `BENCH_JSON {...}` with the counts and latency percentiles in µs.

local header_name = os.getenv("BENCH_HEADER_NAME")
if header_name and header_name ~= "" then
  wrk.headers[header_name] = os.getenv("BENCH_HEADER_VALUE") or ""
end

local vary = os.getenv("BENCH_VARY_HEADER")
if vary and vary ~= "" then
  local sent = 0
  -- wrk calls request() once before the run (to count pipelined requests) and never sends
  -- what that call returns: one more value than the count makes the count arrive.
  local count = (tonumber(os.getenv("BENCH_VARY_COUNT") or "") or 1000000) + 1
  local offset = tonumber(os.getenv("BENCH_VARY_OFFSET") or "") or 0
  function request()
    if sent >= count then
      -- Every distinct value has been sent: stop this thread (the connections still waiting
      -- are closed), and repeat the last value meanwhile so no new key is made.
      wrk.thread:stop()
    else
      sent = sent + 1
      wrk.headers[vary] = string.format("k%d", offset + sent)
    end
    return wrk.format()
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,'
      .. '"read_errors":%d,"write_errors":%d,"status_errors":%d,"timeouts":%d,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.mean, latency.max))
end
