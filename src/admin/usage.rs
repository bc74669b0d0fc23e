//! The usage API: what an identity has used of each rule keyed on it, and the two
//! changes support staff make: start a counter over, or grant more for the current window.
//!
//! - `GET /usage?api_key=ID` (or `user=` / `plan=`): every rule whose key is built from that
//!   identity alone (parts `api_key`, `user`, `plan`), read from the store the rule counts in.
//! - `GET /usage/thresholds`: per such rule, how many of the configured identities have used at
//!   least each webhook threshold (80 % and 100 % without webhooks) of their limit: the
//!   dashboard's "Quota use".
//! - `POST /usage/reset` `{"rule", "api_key" | "user" | "plan"}`: the counter starts over, and
//!   a `block_for` ban of that key is lifted (`"ban_lifted"` in the answer says whether one was).
//! - `POST /usage/grant` `{"rule", "api_key" | ..., "amount"}`: `amount` more for the current
//!   window of a fixed-window (or calendar) rule, gone when the window ends.
//!
//! A request that names an unknown rule or identity, a rule not keyed on that identity, or a
//! bad amount gets a 4xx problem+json saying which, and changes nothing. Every change is
//! logged (whether the admin token was used, never the token; the counter before and after)
//! and counted in `floodgate_usage_changes_total{action}`.
//!
//! What a change guarantees (the README's "Usage API" says the same to operators):
//! - A reset starts a new epoch of the counter: refunds, true-ups and lease returns of
//!   charges made before it are dropped (see [`UsageChange::Reset`]); this instance's own
//!   quota lease of the key is forgotten. A grant is a difference that commutes with them.
//! - A concurrency rule is never reset: its count is the requests running now, and freeing
//!   their slots would let more run at once than the limit (409).
//! - A change gets [`CHANGE_TIMEOUT`] (or `store.timeout`, if longer), not the request
//!   path's deadline. A 503 for a timeout means not applied: the store refuses a change that
//!   reaches it past its deadline. An `Idempotency-Key` header makes a retry land once.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::LazyLock;
use std::time::Duration;

use http::{HeaderMap, Method, Response, StatusCode};
use prometheus::{IntCounterVec, Opts};

use super::{json, percent_decode, problem};
use crate::config::Config;
use crate::gateway::Gateway;
use crate::limiter::algorithm::MAX_COUNT;
use crate::limiter::policy::Scope;
use crate::limiter::store::{
    Changed, Replay, StoreError, Usage, UsageCall, UsageChange, MAX_IDEMPOTENCY_KEY,
};
use crate::limiter::Check;
use crate::rules::{KeyPart, RequestView, Rule};
use crate::wire::auth::{HeaderText, Identity};
use crate::wire::response::{ceil_secs, Problem};

/// The largest body `POST /usage/*` reads: a rule name, an identity and a number.
pub const MAX_BODY: usize = 4096;

/// The least time a reset or grant gives the store: an operator's change is worth waiting
/// for, unlike a request's decision (`store.timeout`, often 20 ms), and a change that times
/// out has to be retried.
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// The header that makes a change's retry land once.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// `floodgate_usage_changes_total{action}`: resets and grants made through the usage API.
static CHANGES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let c = IntCounterVec::new(
        Opts::new(
            "floodgate_usage_changes_total",
            "Counters changed through the admin usage API, by action (reset, grant).",
        ),
        &["action"],
    )
    .expect("static metric definition");
    for action in ["reset", "grant"] {
        c.with_label_values(&[action]);
    }
    crate::metrics::metrics().register(Box::new(c.clone()));
    c
});

/// Registers the usage metrics, so that `/metrics` lists them before the first change.
pub fn register_metrics() {
    LazyLock::force(&CHANGES);
}

/// Which identity a usage request names: the field (`api_key`, `user` or `plan`) and value.
struct Who {
    field: &'static str,
    value: String,
    /// The identity as key parts read it: a key's whole identity for `api_key`, only the user
    /// or only the plan otherwise.
    identity: Identity,
}

impl Who {
    /// The key parts a counter may be built from for this identity alone.
    fn can_key(&self, part: &KeyPart) -> bool {
        match self.field {
            "api_key" => matches!(part, KeyPart::ApiKey | KeyPart::User | KeyPart::Plan),
            "user" => matches!(part, KeyPart::User),
            _ => matches!(part, KeyPart::Plan),
        }
    }

    /// The counter `rule` keeps for this identity, or `None` when its key needs more than the
    /// identity (an IP, a path, a header) or a part the identity lacks (a key without a plan).
    fn check(&self, rule: &Rule) -> Option<Check> {
        if !rule.key_parts.iter().all(|p| self.can_key(p)) {
            return None;
        }
        let headers = HeaderMap::new();
        let view = RequestView {
            route: "",
            case_sensitive: true,
            method: &Method::GET,
            path: "/",
            query: None,
            host: None,
            headers: &headers,
            ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            identity: Some(&self.identity),
        };
        let p = &rule.policy;
        Some(Check {
            rule: p.name.clone(),
            counter: rule.counter_id(&view)?,
            limit: p.limit.clone(),
            cost: p.cost,
        })
    }
}

/// The identity `field=value` names, or a 4xx saying why not: a field that is not one of
/// the three, or a value no configured key has.
fn resolve(cfg: &Config, field: &str, value: &str) -> Result<Who, Box<Response<Vec<u8>>>> {
    let field: &'static str = match field {
        "api_key" => "api_key",
        "user" => "user",
        "plan" => "plan",
        other => {
            return Err(bad(format!(
                "name one identity: api_key, user or plan (not \"{other}\")"
            )))
        }
    };
    let table = cfg.auth.keys.table();
    let known = table.identities().find(|i| match field {
        "api_key" => i.id.as_str() == value,
        "user" => i.user.as_str() == value,
        _ => i.plan.as_ref().is_some_and(|p| p.as_str() == value),
    });
    let Some(known) = known else {
        return Err(not_found(format!(
            "no configured key has {field} \"{value}\""
        )));
    };
    let text = |s: &str| HeaderText::new(s).unwrap_or_else(|| known.id.clone());
    let identity = match field {
        "api_key" => Identity::clone(known),
        "user" => Identity {
            id: text(""),
            user: known.user.clone(),
            plan: None,
            claims: None,
        },
        _ => Identity {
            id: text(""),
            user: text(""),
            plan: known.plan.clone(),
            claims: None,
        },
    };
    Ok(Who {
        field,
        value: value.to_string(),
        identity,
    })
}

/// The store `rule` counts in: the in-process one for local rules, the configured one (which
/// is also in process on the memory backend) for global rules. A reset made now also forgets
/// this instance's quota lease of the key (its permits belong to the old epoch).
async fn usage_of(
    gateway: &Gateway,
    cfg: &Config,
    rule: &Rule,
    check: &Check,
    change: UsageChange,
    idempotency_key: Option<&str>,
) -> Result<Changed, StoreError> {
    let changed = match rule.policy.scope {
        Scope::Local => gateway
            .limiter
            .memory()
            .usage(check, change, idempotency_key),
        Scope::Global => {
            let timeout = if change == UsageChange::Read {
                cfg.store.timeout
            } else {
                cfg.store.timeout.max(CHANGE_TIMEOUT)
            };
            let call = UsageCall {
                timeout,
                idempotency_key,
            };
            gateway.limiter.store().usage(check, change, call).await?
        }
    };
    if change == UsageChange::Reset && changed.replay == Replay::Fresh {
        gateway.limiter.forget_lease(check);
    }
    Ok(changed)
}

/// Lifts the `block_for` ban of `check`'s key wherever `rule` keeps it: the shared store's (for
/// a global rule) and the ones the limiter holds in process (local rules, the memory backend,
/// and bans remembered from the shared store for an outage). Whether a live ban was lifted.
async fn lift_ban(
    gateway: &Gateway,
    cfg: &Config,
    rule: &Rule,
    check: &Check,
) -> Result<bool, StoreError> {
    let shared = match rule.policy.scope {
        Scope::Local => false,
        Scope::Global => {
            gateway
                .limiter
                .store()
                .lift_ban(check, cfg.store.timeout)
                .await?
        }
    };
    let in_process = gateway.limiter.lift_ban(check);
    Ok(shared || in_process)
}

fn usage_json(rule: &str, u: &Usage) -> serde_json::Value {
    serde_json::json!({
        "rule": rule,
        "limit": u.limit,
        "used": u.used,
        "remaining": u.remaining,
        "reset": ceil_secs(u.reset),
    })
}

/// `GET /usage?api_key=ID` (or `user=` / `plan=`).
pub async fn read(gateway: &Gateway, cfg: &Config, query: &str) -> Response<Vec<u8>> {
    let pairs: Vec<(&str, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k, percent_decode(v))
        })
        .collect();
    let [(field, value)] = pairs.as_slice() else {
        return *bad("name exactly one identity: ?api_key=ID, ?user=NAME or ?plan=NAME".into());
    };
    let who = match resolve(cfg, field, value) {
        Ok(who) => who,
        Err(resp) => return *resp,
    };
    let mut rules = Vec::new();
    for rule in &cfg.rules {
        let Some(check) = who.check(rule) else {
            continue;
        };
        match usage_of(gateway, cfg, rule, &check, UsageChange::Read, None).await {
            Ok(c) => rules.push(usage_json(&rule.policy.name, &c.before)),
            Err(e) => return store_failed(&e, false),
        }
    }
    json(
        StatusCode::OK,
        &serde_json::json!({ who.field: who.value, "rules": rules }),
    )
}

/// How many configured keys `GET /usage/thresholds` looks at, at most: each costs a store read
/// per rule it keys.
pub const MAX_THRESHOLD_KEYS: usize = 10_000;

/// The thresholds `GET /usage/thresholds` reports: every webhook's, or 80 % and 100 % when no
/// webhook names any.
fn thresholds_of(cfg: &Config) -> Vec<f64> {
    let mut all: Vec<f64> = cfg
        .webhooks
        .iter()
        .flat_map(|w| w.thresholds.iter().copied())
        .collect();
    if all.is_empty() {
        all = vec![0.8, 1.0];
    }
    all.sort_by(f64::total_cmp);
    all.dedup();
    all
}

/// `GET /usage/thresholds`: per rule keyed on identities alone, how many of the identities
/// the configured keys name (each counter once: keys sharing a user share a `user` counter)
/// have used at least each threshold of their limit now; what the dashboard shows.
pub async fn thresholds(gateway: &Gateway, cfg: &Config) -> Response<Vec<u8>> {
    let thresholds = thresholds_of(cfg);
    let table = cfg.auth.keys.table();
    let keys: Vec<Who> = table
        .identities()
        .take(MAX_THRESHOLD_KEYS)
        .map(|i| Who {
            field: "api_key",
            value: i.id.as_str().to_string(),
            identity: Identity::clone(i),
        })
        .collect();
    let mut rules = Vec::new();
    for rule in &cfg.rules {
        let mut seen = std::collections::HashSet::new();
        let mut above = vec![0u64; thresholds.len()];
        for who in &keys {
            let Some(check) = who.check(rule) else {
                continue;
            };
            if !seen.insert(check.counter) {
                continue;
            }
            let u = match usage_of(gateway, cfg, rule, &check, UsageChange::Read, None).await {
                Ok(c) => c.before,
                Err(e) => return store_failed(&e, false),
            };
            for (n, t) in above.iter_mut().zip(&thresholds) {
                if u.limit > 0 && u.used as f64 >= t * u.limit as f64 {
                    *n += 1;
                }
            }
        }
        if seen.is_empty() {
            continue;
        }
        let counters = seen.len() as u64;
        let shares: Vec<serde_json::Value> = thresholds
            .iter()
            .zip(&above)
            .map(|(t, n)| {
                serde_json::json!({
                    "threshold": t,
                    "identities": n,
                    "share": *n as f64 / counters as f64,
                })
            })
            .collect();
        rules.push(serde_json::json!({
            "rule": &*rule.policy.name,
            "identities": counters,
            "above": shares,
        }));
    }
    json(
        StatusCode::OK,
        &serde_json::json!({ "thresholds": thresholds, "rules": rules }),
    )
}

/// The `Idempotency-Key` of a change, if it sent one, or a 400 saying what a key may be.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, Box<Response<Vec<u8>>>> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let rule = format!(
        "the Idempotency-Key header must be one value of 1 to {MAX_IDEMPOTENCY_KEY} characters A-Z, a-z, 0-9, '-', '_', '.' or ':'"
    );
    if values.next().is_some() {
        return Err(bad(rule));
    }
    let text = value.to_str().ok().filter(|t| {
        (1..=MAX_IDEMPOTENCY_KEY).contains(&t.len())
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    });
    text.map(Some).ok_or_else(|| bad(rule))
}

/// `POST /usage/reset` and `POST /usage/grant` (`grant`: with an `amount`), with the request's
/// `headers` (an `Idempotency-Key`).
pub async fn change(
    gateway: &Gateway,
    cfg: &Config,
    headers: &HeaderMap,
    body: &[u8],
    grant: bool,
) -> Response<Vec<u8>> {
    let action = if grant { "grant" } else { "reset" };
    let key = match idempotency_key(headers) {
        Ok(key) => key,
        Err(resp) => return *resp,
    };
    let v = match asked_change(body, grant) {
        Ok(v) => v,
        Err(resp) => return *resp,
    };
    let AskedChange {
        rule: rule_name,
        field,
        value,
        change,
    } = v;
    let (rule_name, value) = (rule_name.as_str(), value.as_str());
    let Some(rule) = cfg.rules.iter().find(|r| &*r.policy.name == rule_name) else {
        return *not_found(format!("no rule is named \"{rule_name}\""));
    };
    let who = match resolve(cfg, field, value) {
        Ok(who) => who,
        Err(resp) => return *resp,
    };
    let Some(check) = who.check(rule) else {
        return *bad(format!(
            "rule \"{rule_name}\" is not keyed on {field} alone (api_key, user, plan), so it keeps no counter for {field} \"{value}\""
        ));
    };
    if grant && !rule.policy.limit.algorithm().capabilities().grant {
        return *bad(format!(
            "rule \"{rule_name}\" is a {}: grants apply to fixed_window rules (and calendar quotas) only",
            rule.policy.limit.algorithm().as_str()
        ));
    }
    if !grant && rule.policy.limit.algorithm().capabilities().holds_slots {
        return *conflict(format!(
            "rule \"{rule_name}\" is a concurrency rule: its count is the requests running now, and a reset would free their slots while they still run (more would run at once than its limit of {}); nothing was changed: its slots come back as those requests end",
            rule.policy.limit.limit()
        ));
    }
    let changed = match usage_of(gateway, cfg, rule, &check, change, key).await {
        Ok(changed) => changed,
        Err(e) => return store_failed(&e, true),
    };
    let Changed {
        before,
        after,
        replay,
    } = changed;
    if let Replay::Conflict = replay {
        return *conflict(format!(
            "this Idempotency-Key was used for another change of rule \"{rule_name}\" for {field} \"{value}\"; nothing was changed: send a new key for a new change"
        ));
    }
    // A reset that left the key banned would answer a full quota while every request is
    // still refused until the ban ends. Lifting is idempotent, so a replayed reset (whose
    // first answer may have been lost with the ban still up) lifts it too.
    let ban_lifted = if grant || rule.policy.limit.block_for().is_zero() {
        false
    } else {
        match lift_ban(gateway, cfg, rule, &check).await {
            Ok(lifted) => lifted,
            Err(e) => return store_failed(&e, true),
        }
    };
    let answer = |replayed: bool| {
        let mut answer = serde_json::json!({
            "action": action,
            field.to_string(): value,
            "before": usage_json(rule_name, &before),
            "after": usage_json(rule_name, &after),
            "replayed": replayed,
        });
        if !grant {
            answer["ban_lifted"] = ban_lifted.into();
        }
        answer
    };
    if let Replay::Repeated = replay {
        let mut resp = json(StatusCode::OK, &answer(true));
        resp.headers_mut().insert(
            "idempotency-replayed",
            http::HeaderValue::from_static("true"),
        );
        return resp;
    }
    CHANGES.with_label_values(&[action]).inc();
    let amount = match change {
        UsageChange::Grant(n) => n,
        _ => 0,
    };
    tracing::info!(
        action,
        rule = rule_name,
        identity = format!("{field} {value}"),
        amount,
        who = if cfg.server.admin_token.is_some() {
            "admin token"
        } else {
            "admin listener (no admin_token set)"
        },
        used_before = before.used,
        used_after = after.used,
        remaining_before = before.remaining,
        remaining_after = after.remaining,
        ban_lifted,
        "usage changed through the admin API"
    );
    json(StatusCode::OK, &answer(false))
}

/// What a grant or reset asks for: the rule, the one identity field (`api_key`, `user` or
/// `plan`) and its value, and the change.
struct AskedChange {
    rule: String,
    field: &'static str,
    value: String,
    change: UsageChange,
}

/// Reads a grant's (`grant`) or a reset's body, or the 400 that says what is wrong with it.
fn asked_change(body: &[u8], grant: bool) -> Result<AskedChange, Box<Response<Vec<u8>>>> {
    let v: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        _ => {
            return Err(bad(format!(
                "the body must be a JSON object, e.g. {}",
                example(grant)
            )))
        }
    };
    let Some(rule) = v.get("rule").and_then(|r| r.as_str()) else {
        return Err(bad(format!("\"rule\" is missing, e.g. {}", example(grant))));
    };
    let named: Vec<&'static str> = ["api_key", "user", "plan"]
        .into_iter()
        .filter(|f| v.get(*f).is_some())
        .collect();
    let [field] = named.as_slice() else {
        return Err(bad(
            "name exactly one identity: \"api_key\", \"user\" or \"plan\"".into(),
        ));
    };
    let Some(value) = v.get(*field).and_then(|s| s.as_str()) else {
        return Err(bad(format!("\"{field}\" must be a string")));
    };
    let change = if grant {
        match v.get("amount").and_then(|a| a.as_u64()) {
            Some(n) if (1..=MAX_COUNT).contains(&n) => UsageChange::Grant(n),
            _ => {
                return Err(bad(format!(
                    "\"amount\" must be a whole number from 1 to {MAX_COUNT}"
                )))
            }
        }
    } else {
        UsageChange::Reset
    };
    Ok(AskedChange {
        rule: rule.to_owned(),
        field,
        value: value.to_owned(),
        change,
    })
}

fn example(grant: bool) -> &'static str {
    if grant {
        r#"{"rule": "daily-quota", "api_key": "acme-prod", "amount": 500}"#
    } else {
        r#"{"rule": "daily-quota", "api_key": "acme-prod"}"#
    }
}

fn bad(detail: String) -> Box<Response<Vec<u8>>> {
    Box::new(problem(Problem::bad_request(detail)))
}

fn not_found(detail: String) -> Box<Response<Vec<u8>>> {
    Box::new(problem(Problem::new(
        "urn:floodgate:problem:not-found",
        "Not Found",
        404,
        detail,
    )))
}

/// 409: the change cannot be made as asked; nothing changed.
fn conflict(detail: String) -> Box<Response<Vec<u8>>> {
    Box::new(problem(Problem::new(
        "urn:floodgate:problem:conflict",
        "Conflict",
        409,
        detail,
    )))
}

/// 503: the store could not answer. For a change (`change`) after a timeout that means not
/// applied (the store refuses a change past its deadline); after another error, a change the
/// store received may have been applied, which a retry with the same Idempotency-Key makes
/// harmless.
fn store_failed(e: &StoreError, change: bool) -> Response<Vec<u8>> {
    let detail = match (change, e) {
        (false, _) => format!("the store could not answer ({e}); try again"),
        (true, StoreError::Timeout) => format!(
            "the store did not answer in time ({e}); the change was not applied and will not be: try again (with an Idempotency-Key, a retry is applied once)"
        ),
        (true, _) => format!(
            "the store could not answer ({e}); if it received the change it may have applied it: retry with the same Idempotency-Key, which applies it once"
        ),
    };
    problem(Problem::new(
        "urn:floodgate:problem:store-unavailable",
        "Service Unavailable",
        503,
        detail,
    ))
}
