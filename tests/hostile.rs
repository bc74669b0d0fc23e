//! Floodgate against hostile clients and hostile configs: raw-socket
//! clients where the request's shape matters, slow and idle connections, request shapes and
//! spellings that try to walk past a limit, secrets that must not leak, log lines a client
//! tries to flood or forge, and configs that pass `check` but would break at run time. Each
//! concern lives in its own file under `tests/hostile/`.

mod common;

#[path = "hostile/configs.rs"]
mod configs;
#[path = "hostile/connections.rs"]
mod connections;
#[path = "hostile/eviction.rs"]
mod eviction;
#[path = "hostile/logs.rs"]
mod logs;
#[path = "hostile/scale.rs"]
mod scale;
#[path = "hostile/secrets.rs"]
mod secrets;
#[path = "hostile/shapes.rs"]
mod shapes;
#[path = "hostile/spellings.rs"]
mod spellings;
