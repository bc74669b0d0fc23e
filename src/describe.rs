//! Human-readable descriptions of a config: what `floodgate check` prints.

use std::fmt::Write as _;

use crate::config::{Config, Route};
use crate::limiter::{LeakyMode, Window};
use crate::rules::Rule;
use crate::text::humantime;

/// A route's match as one short phrase.
pub fn route_match(r: &Route) -> String {
    let parts = r.matcher.describe();
    if parts.is_empty() {
        "any request".to_string()
    } else {
        parts.join(" ")
    }
}

/// A rule's match as one short phrase.
pub fn rule_match(r: &Rule) -> String {
    let m = &r.matcher;
    let mut parts = Vec::new();
    if let Some(v) = &m.route {
        parts.push(format!("route={v}"));
    }
    parts.extend(m.request.describe());
    if let Some(v) = &m.plan {
        parts.push(format!("plan={v}"));
    }
    if let Some((name, value)) = &m.header {
        match value {
            Some(v) => parts.push(format!("header {name}={v}")),
            None => parts.push(format!("header {name} present")),
        }
    }
    if let Some(c) = &m.claim {
        parts.push(match &c.test {
            crate::rules::ClaimTest::Present => format!("claim {} present", c.name),
            crate::rules::ClaimTest::Equals(v) => format!("claim {}={v}", c.name),
            crate::rules::ClaimTest::Contains(v) => format!("claim {} contains {v}", c.name),
        });
    }
    if parts.is_empty() {
        "every request".to_string()
    } else {
        parts.join(" ")
    }
}

/// A rule's limit as one short phrase, e.g. `token_bucket 100/1m burst 20`.
pub fn rule_limit(r: &Rule) -> String {
    let l = &r.limit;
    let caps = l.algorithm().capabilities();
    let name = l.algorithm().as_str();
    let mut out = match caps.window {
        Window::None { .. } => format!("{name} {} in flight", l.limit()),
        Window::Required => match l.calendar() {
            Some(c) => format!(
                "{name} {}/{} {}",
                l.limit(),
                c.period().as_str(),
                c.zone_name()
            ),
            None => format!("{name} {}/{}", l.limit(), humantime(l.window())),
        },
    };
    if caps.burst {
        let _ = write!(out, " burst {}", l.burst());
    }
    if caps.shaping.is_some() {
        match l.mode() {
            LeakyMode::Police => out.push_str(" police"),
            LeakyMode::Shape => {
                let _ = write!(out, " shape max_delay {}", humantime(l.max_delay()));
            }
            // Said below, for every algorithm that can slow.
            LeakyMode::Slow => {}
        }
    }
    if let Some(rate) = l.slow_rate() {
        let _ = write!(
            out,
            " slow slow_rate {}",
            crate::text::rate::show_rate(rate)
        );
    }
    if let Some(f) = &r.limit_from {
        let _ = write!(out, " (limit from claim:{}, at most {})", f.claim, f.max);
    }
    out
}

/// The text `floodgate check` prints for a valid config.
pub fn check_report(cfg: &Config) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}: OK", cfg.path.display());
    for w in &cfg.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    let _ = writeln!(out, "store: {}", cfg.store.backend.as_str());
    if !cfg.auth.tokens.is_empty() {
        let _ = writeln!(out, "token issuers:");
        for i in &cfg.auth.tokens.issuers {
            let algs: Vec<String> = i.algorithms.iter().map(|a| format!("{a:?}")).collect();
            let _ = writeln!(
                out,
                "  {}: iss {} | aud [{}] | {} | keys {}",
                i.name,
                i.issuer,
                i.audiences.join(", "),
                algs.join(", "),
                i.keys.describe()
            );
        }
    }
    let _ = writeln!(out, "upstreams:");
    for u in &cfg.upstreams {
        let targets: Vec<&str> = u.settings.targets.iter().map(|t| &*t.name).collect();
        let _ = writeln!(
            out,
            "  {}: [{}] {}",
            u.name,
            targets.join(", "),
            crate::upstream::summary(&u.settings)
        );
    }
    let reach = crate::config::reach::reach(cfg);
    for &(j, i) in &reach.shadowed {
        let _ = writeln!(
            out,
            "warning: route \"{}\" never sees a request: route \"{}\" before it takes them all",
            cfg.routes[j].name, cfg.routes[i].name
        );
    }
    for (k, why) in &reach.dead_rules {
        let _ = writeln!(
            out,
            "warning: rule \"{}\" can never match: {why}",
            cfg.rules[*k].name
        );
    }
    let _ = writeln!(out, "routes (first match wins):");
    for (i, r) in cfg.routes.iter().enumerate() {
        let reached = match &reach.rules_per_route {
            Some(n) if n[i] == 1 => " | 1 rule".to_string(),
            Some(n) => format!(" | {} rules", n[i]),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "  {}. {}: {} -> upstream {} (auth {}){}{reached}",
            i + 1,
            r.name,
            route_match(r),
            r.upstream.name,
            r.auth.as_str(),
            edges_text(&r.edges)
        );
    }
    if reach.rules_per_route.is_none() {
        let _ = writeln!(
            out,
            "  (rules per route not counted: {} routes and {} rules are past check's budget of {} pairs)",
            cfg.routes.len(),
            cfg.rules.len(),
            crate::config::reach::PAIR_BUDGET
        );
    }
    let _ = writeln!(
        out,
        "rules (checked in order; every matching rule applies):"
    );
    for (i, r) in cfg.rules.iter().enumerate() {
        let keys: Vec<String> = r.key_parts.iter().map(|k| k.to_config_string()).collect();
        let _ = writeln!(
            out,
            "  {}. {}: {} | key [{}] | {} | cost {} | scope {} | on_store_error {}{}{}{}",
            i + 1,
            r.name,
            rule_match(r),
            keys.join(", "),
            rule_limit(r),
            r.cost,
            r.scope.as_str(),
            r.on_store_error.as_str(),
            r.lease
                .map(|l| format!(" | {}", lease_text(&l)))
                .unwrap_or_default(),
            respond_text(&r.respond),
            if r.shadow { " | shadow" } else { "" }
        );
    }
    out
}

/// What a rule learns from the response, as `check` lists it after the rule's other
/// settings: ` | count [401, 5xx] | cost_from json:usage.total_tokens | block_for 15m`, or
/// nothing.
pub fn respond_text(r: &crate::limiter::reservation::Respond) -> String {
    let mut out = String::new();
    if let Some(count) = &r.count {
        let _ = write!(out, " | count [{}]", count.to_config_string());
    }
    if let Some(from) = &r.cost_from {
        let _ = write!(out, " | cost_from {}", from.to_config_string());
    }
    if let Some(block) = r.block_for {
        let _ = write!(out, " | block_for {}", humantime(block));
    }
    out
}

/// A rule's quota leasing as `check` prints it: `lease auto for 1s`.
pub fn lease_text(l: &crate::limiter::lease::Lease) -> String {
    format!("lease {} for {}", lease_size(l), humantime(l.ttl))
}

/// `lease` as gateway.toml writes it: `auto` or the number of permits.
fn lease_size(l: &crate::limiter::lease::Lease) -> String {
    match l.size {
        crate::limiter::lease::LeaseSize::Auto => "auto".into(),
        crate::limiter::lease::LeaseSize::Permits(n) => n.to_string(),
    }
}

/// A rule as the admin API's JSON shows it.
pub fn rule_json(r: &Rule) -> serde_json::Value {
    let m = &r.matcher;
    let mut matcher = serde_json::Map::new();
    let mut put = |k: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            matcher.insert(k.to_string(), v);
        }
    };
    put("route", m.route.clone().map(Into::into));
    put("host", m.request.host.clone().map(Into::into));
    put("path", m.request.path.clone().map(Into::into));
    put("path_prefix", m.request.path_prefix.clone().map(Into::into));
    put(
        "methods",
        m.request
            .methods
            .as_ref()
            .map(|v| v.iter().map(|m| m.as_str()).collect::<Vec<_>>().into()),
    );
    put("plan", m.plan.clone().map(Into::into));
    put(
        "header",
        m.header
            .as_ref()
            .map(|(n, v)| serde_json::json!({"name": n.as_str(), "value": v})),
    );
    put(
        "claim",
        m.claim.as_ref().map(|c| match &c.test {
            crate::rules::ClaimTest::Present => serde_json::json!({"name": c.name}),
            crate::rules::ClaimTest::Equals(v) => serde_json::json!({"name": c.name, "equals": v}),
            crate::rules::ClaimTest::Contains(v) => {
                serde_json::json!({"name": c.name, "contains": v})
            }
        }),
    );
    let l = &r.limit;
    let mut v = serde_json::json!({
        "name": &*r.name,
        "match": matcher,
        "key": r.key_parts.iter().map(|k| k.to_config_string()).collect::<Vec<_>>(),
        "algorithm": l.algorithm().as_str(),
        "limit": l.limit(),
        "scope": r.scope.as_str(),
        "on_store_error": r.on_store_error.as_str(),
        "cost": r.cost,
        "shadow": r.shadow,
        "headers": r.headers,
        "status": r.status,
    });
    let caps = l.algorithm().capabilities();
    if let Some(c) = l.calendar() {
        v["calendar"] = c.period().as_str().into();
        v["timezone"] = c.zone_name().into();
    } else if caps.window == Window::Required {
        v["window"] = humantime(l.window()).into();
    }
    if let Some(lease) = &r.lease {
        v["lease"] = match lease.size {
            crate::limiter::lease::LeaseSize::Auto => "auto".into(),
            crate::limiter::lease::LeaseSize::Permits(n) => n.into(),
        };
        v["lease_ttl"] = humantime(lease.ttl).into();
    }
    if caps.burst {
        v["burst"] = l.burst().into();
    }
    if caps.shaping.is_some() {
        v["mode"] = l.mode().as_str().into();
        if l.mode() == LeakyMode::Shape {
            v["max_delay"] = humantime(l.max_delay()).into();
        }
    }
    if let Some(rate) = l.slow_rate() {
        v["mode"] = l.mode().as_str().into();
        v["slow_rate"] = rate.into();
    }
    v
}

/// The rules, in the order they are checked, as a Markdown table.
pub fn rules_markdown(cfg: &Config) -> String {
    let mut out = String::from(
        "| # | rule | match | key | algorithm | limit | scope | on store error | cost | shadow | headers | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (i, r) in cfg.rules.iter().enumerate() {
        let keys: Vec<String> = r.key_parts.iter().map(|k| k.to_config_string()).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            md(&r.name),
            md(&rule_match(r)),
            md(&keys.join(", ")),
            r.limit.algorithm().as_str(),
            md(&rule_limit(r)),
            r.scope.as_str(),
            r.on_store_error.as_str(),
            r.cost,
            if r.shadow { "yes" } else { "no" },
            if r.headers { "yes" } else { "no" },
            r.status
        );
    }
    out
}

fn md(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Text safe inside a quoted Mermaid label.
fn mermaid(s: &str) -> String {
    s.replace('"', "#quot;")
        .replace('<', "#lt;")
        .replace('>', "#gt;")
}

/// A Mermaid flowchart of the request path: clients, floodgate, the rules in order (each can
/// reject to 429), the upstreams, the store and metrics.
pub fn diagram(cfg: &Config) -> String {
    let mut out = String::from("flowchart LR\n");
    let _ = writeln!(out, "    clients([clients]) --> gw[floodgate]");
    let _ = writeln!(
        out,
        "    gw --> route{{\"route: {} routes, first match\"}}",
        cfg.routes.len()
    );
    let _ = writeln!(out, "    route -- no route --> nf[404]");
    let _ = writeln!(out, "    route --> auth{{\"API key\"}}");
    let _ = writeln!(out, "    auth -- missing or invalid --> ua[401]");
    let _ = writeln!(out, "    rej[\"429 Too Many Requests + Retry-After\"]");
    let mut prev = "auth".to_string();
    for (i, r) in cfg.rules.iter().enumerate() {
        let id = format!("r{}", i + 1);
        let shadow = if r.shadow { " (shadow)" } else { "" };
        let _ = writeln!(
            out,
            "    {prev} --> {id}[\"{}. {}{}<br/>{}<br/>key: {}\"]",
            i + 1,
            mermaid(&r.name),
            shadow,
            mermaid(&rule_limit(r)),
            mermaid(
                &r.key_parts
                    .iter()
                    .map(|k| k.to_config_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        );
        if !r.shadow {
            let _ = writeln!(out, "    {id} -- over limit --> rej");
        }
        if r.scope == crate::rules::Scope::Global {
            let _ = writeln!(out, "    {id} -.- store");
        }
        prev = id;
    }
    let _ = writeln!(out, "    {prev} -- allowed --> upstreams");
    let _ = writeln!(out, "    subgraph upstreams");
    for u in &cfg.upstreams {
        let _ = writeln!(
            out,
            "        u_{}[\"{}: {}\"]",
            sanitize(&u.name),
            mermaid(&u.name),
            mermaid(&crate::upstream::summary(&u.settings))
        );
    }
    let _ = writeln!(out, "    end");
    let _ = writeln!(
        out,
        "    store[(\"store: {}\")]",
        cfg.store.backend.as_str()
    );
    let _ = writeln!(out, "    prom[Prometheus] -.-> |/metrics| gw");
    out
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// A route's edges for `check`: ` | rewrite ... | host ... | ...`, empty without any.
fn edges_text(e: &crate::config::Edges) -> String {
    use crate::wire::rewrite::Rewrite;
    let mut parts = Vec::new();
    match &e.rewrite {
        Some(Rewrite::StripPrefix(p)) => parts.push(format!("strip_prefix {p}")),
        Some(Rewrite::Prefix(p, with)) => parts.push(format!("prefix_rewrite {p} -> {with}")),
        Some(Rewrite::Regex(re, with)) => {
            parts.push(format!("regex_rewrite {} -> {with}", re.as_str()))
        }
        None => {}
    }
    if let Some(h) = &e.host_rewrite {
        parts.push(format!("host_rewrite {h}"));
    }
    if let Some(h) = &e.request_headers {
        parts.push(format!("request_headers {}", h.describe()));
    }
    if let Some(h) = &e.response_headers {
        parts.push(format!("response_headers {}", h.describe()));
    }
    if let Some(c) = &e.cors {
        parts.push(format!("cors {}", c.describe()));
    }
    if let Some(a) = &e.ips.allow {
        parts.push(format!("allow_ips {}", a.listed()));
    }
    if let Some(d) = &e.ips.deny {
        parts.push(format!("deny_ips {}", d.listed()));
    }
    parts.iter().map(|p| format!(" | {p}")).collect()
}
