//! What a config can reach, for `floodgate check`: how many rules can apply to each route's
//! requests, the routes an earlier route leaves no request to, and the rules no request can
//! meet. A rule or a route that can never match is almost always a mistake (a typo in a
//! prefix, a host the route never sees, a plan on a route that reads no keys), and one that
//! costs nothing to say before it is in force.
//!
//! The answers are about what the matches fix (route, host, path, methods, plan and claims
//! against the route's auth): a header or claim value is taken as possible.

use http::Method;

use super::{AuthMode, Config, Route};
use crate::rules::Rule;
use crate::wire::match_index::{Candidates, Probe};
use crate::wire::matching::{path_has_prefix_case, RequestMatch};

/// Route and rule pairs compared at most, so that `check` of a hostile file stays quick:
/// rules that name their route cost one pair each; the others cost one per route.
pub const PAIR_BUDGET: usize = 20_000_000;

/// What [`reach`] found.
#[derive(Debug, Default)]
pub struct Reach {
    /// Per route, how many rules can apply to its requests; `None` past [`PAIR_BUDGET`].
    pub rules_per_route: Option<Vec<usize>>,
    /// Routes that never see a request, each with the earlier route that takes them all.
    pub shadowed: Vec<(usize, usize)>,
    /// Rules no route's request can meet, each with why.
    pub dead_rules: Vec<(usize, String)>,
}

/// A match's paths: one, those under a prefix, or any.
#[derive(Clone, Copy)]
enum Paths<'a> {
    Exact(&'a str),
    Prefix(&'a str),
    Any,
}

fn paths(m: &RequestMatch) -> Paths<'_> {
    if let Some(p) = m.path.as_deref() {
        return Paths::Exact(p);
    }
    match m.path_prefix.as_deref() {
        Some(p) if !p.is_empty() && p != "/" => Paths::Prefix(p.strip_suffix('/').unwrap_or(p)),
        _ => Paths::Any,
    }
}

/// Whether some path is in both, compared as the route compares (`case_sensitive`).
fn paths_meet(a: Paths<'_>, b: Paths<'_>, case_sensitive: bool) -> bool {
    let same = |x: &str, y: &str| {
        if case_sensitive {
            x == y
        } else {
            x.eq_ignore_ascii_case(y)
        }
    };
    match (a, b) {
        (Paths::Any, _) | (_, Paths::Any) => true,
        (Paths::Exact(x), Paths::Exact(y)) => same(x, y),
        (Paths::Exact(x), Paths::Prefix(p)) | (Paths::Prefix(p), Paths::Exact(x)) => {
            path_has_prefix_case(x, p, case_sensitive)
        }
        (Paths::Prefix(p), Paths::Prefix(q)) => {
            path_has_prefix_case(p, q, case_sensitive) || path_has_prefix_case(q, p, case_sensitive)
        }
    }
}

/// Whether some method fits both. A method both take is one listed by one of them (a `HEAD`
/// taken as `GET` by one is listed as `GET` by both, or as `HEAD` by the other).
fn methods_meet(a: &RequestMatch, b: &RequestMatch) -> bool {
    let listed =
        |x: &RequestMatch, y: &RequestMatch| x.methods.iter().flatten().any(|m| y.takes_method(m));
    a.methods.is_none() || b.methods.is_none() || listed(a, b) || listed(b, a)
}

/// Why a rule can apply to none of a route's requests, or `None` when it can to some.
fn misses(rule: &Rule, route: &Route) -> Option<&'static str> {
    let m = &rule.matcher;
    if m.route.as_deref().is_some_and(|r| *r != *route.name) {
        return Some("it names another route");
    }
    if let (Some(a), Some(b)) = (&m.request.host, &route.matcher.host) {
        if a != b {
            return Some("its host is not the route's");
        }
    }
    if !methods_meet(&m.request, &route.matcher) {
        return Some("its methods are not the route's");
    }
    if !paths_meet(
        paths(&m.request),
        paths(&route.matcher),
        route.case_sensitive,
    ) {
        return Some("its path is not under the route's");
    }
    if m.plan.is_some() && route.auth == AuthMode::None {
        return Some("it matches a plan and the route reads no key (auth = \"none\")");
    }
    if m.claim.is_some() && !route.auth.reads_tokens() {
        return Some("it matches a claim and the route reads no token");
    }
    None
}

/// Whether route `a` (earlier) takes every request route `b` would match.
fn covers(a: &Route, b: &Route) -> bool {
    let (x, y) = (&a.matcher, &b.matcher);
    if x.host.is_some() && x.host != y.host {
        return false;
    }
    // Each method `b` lists is taken by `a` (a `GET` taken covers its `HEAD` too).
    let methods_taken = match &y.methods {
        None => x.methods.is_none(),
        Some(want) => want.iter().all(|m| x.takes_method(m)),
    };
    if !methods_taken {
        return false;
    }
    // A case-sensitive route does not take the other spellings a case-insensitive one does.
    if a.case_sensitive && !b.case_sensitive && !matches!(paths(x), Paths::Any) {
        return false;
    }
    let cs = a.case_sensitive;
    match (paths(x), paths(y)) {
        (Paths::Any, _) => true,
        (_, Paths::Any) => false,
        (Paths::Exact(p), Paths::Exact(q)) => {
            if cs {
                p == q
            } else {
                p.eq_ignore_ascii_case(q)
            }
        }
        (Paths::Exact(_), Paths::Prefix(_)) => false,
        (Paths::Prefix(p), Paths::Exact(q)) => path_has_prefix_case(q, p, cs),
        // Under `/a`, `/a.json` is only the last segment: `/a.json/1` is not taken.
        (Paths::Prefix(p), Paths::Prefix(q)) => {
            path_has_prefix_case(q, p, cs) && {
                let rest = &q[p.len()..];
                rest.is_empty() || rest.starts_with('/')
            }
        }
    }
}

/// A request route `b` matches, to find the earlier routes that could take it.
fn probe_of(b: &Route) -> (Option<&str>, Method, &str) {
    let m = &b.matcher;
    let method = m
        .methods
        .as_ref()
        .and_then(|l| l.first().cloned())
        .unwrap_or(Method::GET);
    let path = match paths(m) {
        Paths::Exact(p) | Paths::Prefix(p) => p,
        Paths::Any => "/",
    };
    (m.host.as_deref(), method, path)
}

/// What `cfg` can reach.
pub fn reach(cfg: &Config) -> Reach {
    let mut out = Reach::default();
    for (j, b) in cfg.routes.iter().enumerate() {
        let (host, method, path) = probe_of(b);
        let probe = Probe {
            route: None,
            host,
            path,
            plan: None,
            method: &method,
        };
        let earlier: Candidates = cfg.route_index.candidates(&probe);
        if let Some(i) = earlier
            .take_while(|&i| i < j)
            .find(|&i| covers(&cfg.routes[i], b))
        {
            out.shadowed.push((j, i));
        }
    }
    let mut open = vec![true; cfg.routes.len()];
    for &(j, _) in &out.shadowed {
        open[j] = false;
    }
    let position = super::route_positions(&cfg.routes);
    let named = cfg
        .rules
        .iter()
        .filter(|r| r.matcher.route.is_some())
        .count();
    let pairs = named + (cfg.rules.len() - named) * cfg.routes.len();
    let mut per_route = vec![0usize; cfg.routes.len()];
    for (k, rule) in cfg.rules.iter().enumerate() {
        let routes: Box<dyn Iterator<Item = usize>> = match rule.matcher.route.as_deref() {
            Some(name) => Box::new(position.get(name).copied().into_iter()),
            None if pairs <= PAIR_BUDGET => Box::new(0..cfg.routes.len()),
            None => continue,
        };
        let mut reached = false;
        // The one reason every route gives, if they agree.
        let mut why: Option<Option<&str>> = None;
        for i in routes {
            let reason = match misses(rule, &cfg.routes[i]) {
                None => {
                    per_route[i] += 1;
                    reached |= open[i];
                    Some("its route never sees a request (an earlier route takes them all)")
                }
                miss => miss,
            };
            why = match why {
                None => Some(reason),
                Some(seen) if seen == reason => Some(seen),
                Some(_) => Some(None),
            };
        }
        if !reached {
            let why = why.flatten().unwrap_or("no route's requests can meet it");
            out.dead_rules.push((k, why.to_string()));
        }
    }
    if pairs <= PAIR_BUDGET {
        out.rules_per_route = Some(per_route);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn methods(list: &[Method]) -> RequestMatch {
        RequestMatch {
            methods: Some(list.to_vec()),
            ..RequestMatch::default()
        }
    }

    /// Methods meet as requests see them: `GET` takes `HEAD`, not the other way.
    #[test]
    fn methods_meet_with_head_taken_as_get() {
        let any = RequestMatch::default();
        let get = methods(&[Method::GET]);
        let head = methods(&[Method::HEAD]);
        let post = methods(&[Method::POST]);
        assert!(methods_meet(&any, &post));
        assert!(methods_meet(&get, &head) && methods_meet(&head, &get));
        assert!(!methods_meet(&get, &post) && !methods_meet(&head, &post));
        assert!(methods_meet(&methods(&[Method::PUT, Method::GET]), &get));
    }
}
