-- floodgate: the algorithm codes of the Rust-Lua contract (src/limiter/redis/script.rs): code i
-- is the i-th function. Composed after every algorithm file, for decide.lua and usage.lua.
local algorithms = {
  fixed_window,
  sliding_window_log,
  sliding_window_counter,
  token_bucket,
  leaky_bucket_police,
  leaky_bucket_shape,
  concurrency,
}
